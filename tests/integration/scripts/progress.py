"""A tqdm progress bar on every party (it redraws with carriage returns)."""
import time

from tqdm import tqdm

for _ in tqdm(range(50), desc="steps", mininterval=0, miniters=1):
    time.sleep(0.01)
print("done", flush=True)
