"""tfpipe trainer."""
