"""What every family of this project shares: its ports (``ports``), how a family is
loaded with the project's services (``loader``) and the one registry the worker's
handlers come from (``registry``)."""
