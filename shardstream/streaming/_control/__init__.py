"""Pass control: which epoch pass each process reads, and how it resumes.

The dataset and the loader only wire; everything about a pass and its resume lives here:

- :mod:`.context`: the one reader of ``torch.distributed`` and ``get_worker_info()``;
- :mod:`.channel`: what the training process tells its DataLoader workers (shared memory);
- :mod:`.resumestate`: the resume-state codec (the one place a state dict is built and checked);
- :mod:`.plancache` and :mod:`.versionset`: a dataset's versions and their epoch plans;
- :mod:`.inputs`: what pass control needs of a dataset (it never imports the dataset);
- :mod:`.workerpass`: the pass a process reads next (fresh, a loader's directive, or restored);
- :mod:`.controller`: one dataset's pass control in one process (the ``Stateful`` protocol);
- :mod:`.position`: a loader's place in the epoch (its state dict);
- :mod:`.run`: what one process runs for a pass (the worker job).
"""
