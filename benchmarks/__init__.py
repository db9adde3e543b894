"""One script per claim; run them with ``make bench``. Never part of ``make test``."""
