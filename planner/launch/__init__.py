"""`planner launch`: the files that run one plan on Megatron-LM, torchtitan or DeepSpeed.

planner.launch.build has the API (run_launch, build_launch, write_launch); planner.launch.options
the option types, which the CLI imports without loading the cost model.
"""
