"""Private training of a (multinomial) logistic regression on the scikit-learn digits.

    crypten-lite launch -n 2 examples/train_logistic_regression.py [--epochs 10] [--lr 0.1]

The model (a single Linear layer, softmax cross-entropy) belongs to party 0, the digits to
party 1; see train_mlp.py for the protocol, what is revealed, and the plaintext baseline
printed next to the private result.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from train_mlp import main  # noqa: E402

if __name__ == "__main__":
    main(hidden_default=0, description="logistic regression")
