"""Long-context tasks: passkey retrieval, BABILong, synthetic copying.

    config.py        the experiment's `task` section (TaskConfig and one dataclass per task)
    datamodules.py   TaskDataModule: task examples with the corpus DataModule's batch contract
    passkey.py       prompts with exact token lengths, the scorer, the depth x length evaluation
    babilong.py      the release's layouts / fields / prompt / label-set metric, evaluation
    babilong_gen.py  offline qa1-qa3 stories hidden in haystack text, answers correct by construction
    copying.py       copying examples, character accuracy, the mean +- std summary over seeds
    runner.py        train then evaluate (`run_task`), results.json + PNG + TensorBoard
    plots.py         heatmaps and the copying curve from results dicts
    cli.py           `recurlen passkey | babilong | copying [overrides]`
"""
