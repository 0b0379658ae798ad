"""Pass control: which epoch pass each process reads, and how it resumes.

The dataset and the loader only wire; everything about a pass and its resume lives here:

- :mod:`.context`: the one reader of ``torch.distributed`` and ``get_worker_info()``, and what
  the training process tells its DataLoader workers (shared memory);
- :mod:`.resumestate`: the resume-state codec (the one place a state dict is built and checked);
- :mod:`.versionset`: a dataset's versions, how the ranks agree on one, and their epoch plans;
- :mod:`.workerpass`: the pass a process reads next (fresh, a loader's directive, or restored),
  what pass control needs of a dataset (it never imports the dataset), and what one process
  runs for a pass (the worker job);
- :mod:`.controller`: one dataset's pass control in one process (the ``Stateful`` protocol);
- :mod:`.position`: a loader's place in the epoch (its state dict).
"""
