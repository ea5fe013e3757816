// perfetto export: see cmd_export.cpp (in progress)
