"""What people read and paste: launch lines, tables, the HTML report, plots, progress."""
