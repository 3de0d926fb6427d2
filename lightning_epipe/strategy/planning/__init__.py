"""Which layers each stage holds and which process runs it: pure planning, plus the one measured split."""
