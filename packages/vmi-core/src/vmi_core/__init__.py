"""vmi-core: targets, compile wrapper, kernel shell, number formats and SF layouts shared by vmi's ops."""

from .environment import refresh_environment as refresh_environment

__version__ = "0.1.0"
