"""One module per schema revision, oldest first; each is frozen once released."""
