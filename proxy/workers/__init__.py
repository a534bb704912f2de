"""Worker processes behind one listener: ``[node] workers = N`` (supervisor, worker, ownership)."""
