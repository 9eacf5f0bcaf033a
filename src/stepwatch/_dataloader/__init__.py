"""DataLoaders seen from inside: the loader found in what a loop iterates (``find``), instrumented and iterated by
``watch()`` in the main process (``watch``), the code that runs inside its worker processes (``in_workers``), and
the workers' reports filed into the recording (``reports``)."""
