"""Presenting: tables, figures, what-if answers, the commands and guesses the notebooks show."""
