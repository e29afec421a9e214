"""NeighborHash from Python: insert feature ids, look them up in a batch, read the stats.

Run: ``make develop && .venv/bin/python examples/index_basics.py``
"""

import random

import embstore


def main() -> None:
    rng = random.Random(7)
    # Structured feature ids: a slot prefix in the high bits, a counter in the low bits.
    ids = [(slot << 40) | n for slot in range(8) for n in range(5_000)]
    rng.shuffle(ids)
    index = embstore.NeighborHash(slots=1 << 16)
    index.insert_batch(ids, range(len(ids)))  # payload: the row slot of each id

    queries = [*ids[:5], 2**64 - 1]
    print("lookups:", index.get_batch(queries))  # the last id is absent -> None

    stats = index.stats()
    print(
        f"{stats['len']} ids in {stats['capacity']} slots (load {stats['load_factor']:.2f}), "
        f"{stats['apcl']:.3f} cachelines per lookup, longest chain {stats['longest_chain']}"
    )

    try:
        index.insert(1, 2**52)  # payloads are 52 bits
    except embstore.InvalidArgumentError as err:
        print("rejected:", err)


if __name__ == "__main__":
    main()
