"""Reading a run back: its report (io), plots and the terminal view."""
