"""Screens of the operator console: the main tabbed screen and the help screen."""
