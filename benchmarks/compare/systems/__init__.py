"""One adapter per job system, all with the interface of ``base.System``."""
