"""The wheels a lent GPU host lacks, resolved against what it has, locked, carried and verified."""
