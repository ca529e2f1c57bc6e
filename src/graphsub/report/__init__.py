"""Reports about graphs and runs."""
