"""What a layer keeps for backward under the memory choices between keeping every activation and
recomputing whole stages: :mod:`.anatomy` counts what a layer's parts save and what recomputing or
offloading them keeps; :mod:`.choices` turns those counts into the uniform choices the planner
searches (selective recomputation, activation offload) and applies one to a profile;
:mod:`.fp8` counts what a layer saves when its linear layers run in FP8 (Transformer Engine).
"""
