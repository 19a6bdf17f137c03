"""Visual question answering: MCAN and LXMERT with the suite's attention variants (in progress)."""
