"""Widgets of the operator console: KPI tiles, time plots and the views behind each tab."""
