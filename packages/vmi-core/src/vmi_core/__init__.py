"""vmi-core: targets, compile wrapper, kernel shell, number formats and SF layouts shared by vmi's ops."""

__version__ = "0.1.0"
