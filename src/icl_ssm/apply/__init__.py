"""Applying a selection: answering inputs with the chosen prompt (its prefix encoded once and
shared), writing the predictions resumably, and exporting the demonstrations to other tools."""
