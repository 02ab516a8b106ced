"""A plan's stages as modules: rebuild the model, split it, and take the stages out.

- :mod:`.rebuild`: the plan's model rebuilt and re-traced into the plan's blocks;
- :mod:`.split`: one fx GraphModule per stage;
- :mod:`.agree`: every rank's trace named as rank 0's and every stage's interface compared;
- :mod:`.source`: a stage as standalone Python source;
- :mod:`.emit` / :mod:`.merge`: stage folders out, the model's ``state_dict`` back;
- :mod:`.export`: stages and a schedule for ``torch.distributed.pipelining``;
- :mod:`.schedule_csv`: the plan's per-rank action order as the CSV torch's ``_PipelineScheduleRuntime`` loads.
"""
