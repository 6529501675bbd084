"""InCore compiler: outlined regions and InCore functions -> backend kernels (torch now) with access plans."""
