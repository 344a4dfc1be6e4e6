"""Post-training as a library: data lanes, interventions, the LightningModule, trainer assembly, the optimiser,
the run directory, resume, preemption and experiment composition. Tasks call it with their own DataModule and
callbacks (`recurlen.training.finetune.run_finetune`)."""
