// replay: see cmd_replay.cpp (in progress)
