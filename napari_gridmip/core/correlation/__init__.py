"""Windowed Pearson correlation, the displacement at its peaks and its sub-pixel refinement."""
