"""The block sizes of a replica's stored step end times and of its noise draws.

Their own module because two modules read them, replica.py (step_once, the completions' timelines) and
decode_runs.py (the decode runs' stretches end at a block's last step), and both must read the same values:
tests/test_sim_step_blocks.py sets STEP_BLOCK to a few steps in every module that reads it, to show that the
records do not depend on it.
"""

# Step-time noise factors are drawn this many at a time (from the replica's rng, when a step first needs one).
NOISE_BLOCK = 65536
# ... and read from lists of this many (NOISE_BLOCK / NOISE_CHUNK of them a block): compiled, a list's item is read
# natively, an array's through the generic item protocol, once per step; a whole block as a list (2 MiB of float
# objects) grew a quickstart tune's peak 88 -> 119 MiB, a chunk at a time holds 128 KiB.
NOISE_CHUNK = 4096
# Step end times are stored in blocks of this many steps. A grown single array kept every outgrown buffer alive
# (records' chunk times are views into it), about as much again as the times themselves.
STEP_BLOCK = 1 << 16
