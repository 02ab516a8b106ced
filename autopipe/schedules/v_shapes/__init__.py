"""The V-shaped schedules: two chunks per device, placed down and back up the pipeline.

``v_block`` builds V schedules from a building block (Qi et al., "Pipeline Parallelism with
Controllable Memory", NeurIPS 2024); ``zb_v``, ``v_half``, ``v_min`` and ``dualpipe_v`` are one
schedule each, registered in :mod:`autopipe.schedules.registry`.
"""
