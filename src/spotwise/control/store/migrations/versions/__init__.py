"""One file per schema revision; the newest is the head this code writes."""
