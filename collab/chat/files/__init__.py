"""Files in a room (issue 36; docs/architecture/files.md): what is done with them."""
