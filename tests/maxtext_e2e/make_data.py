"""Writes the e2e's grain data set: one ArrayRecord file of pre-tokenized `tf.train.Example`s, the
format MaxText's grain pipeline parses (`ParseFeatures`, maxtext/input_pipeline/input_pipeline_utils.py)
with `tokenize_train_data=false`: a `text` feature of int64 token ids. Run with .venv-maxtext's
Python (MaxText's own example_pb2, array_record):

    .venv-maxtext/bin/python tests/maxtext_e2e/make_data.py OUT.array_record RECORDS VOCAB SEED
"""

import random
import sys

from array_record.python.array_record_module import ArrayRecordWriter
from maxtext.input_pipeline.protos import example_pb2


def main(path: str, records: int, vocab: int, seed: int) -> None:
    rng = random.Random(seed)
    writer = ArrayRecordWriter(path, "group_size:1")
    for _ in range(records):
        # Lengths around max_target_length (32 in the e2e): some padded, some truncated.
        tokens = [rng.randrange(1, vocab) for _ in range(rng.randrange(12, 48))]
        example = example_pb2.Example()
        example.features.feature["text"].int64_list.value.extend(tokens)
        writer.write(example.SerializeToString())
    writer.close()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
