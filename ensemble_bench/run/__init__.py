"""Running a recipe: the runner, run folders and their lock, row stores and checks, sittings, the lm-eval
adapter, building members and methods, and the preflight of the machine. Imports no report and no CLI."""
