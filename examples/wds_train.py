"""webdataset's training pattern, with only the import changed.

This is the loop of webdataset's own training examples: resampled shards, a
shard splitter, ``.shuffle(1000)``, decode, ``to_tuple``, ``map_tuple``,
``batched``, then the cross-worker re-mixing idiom
``WebLoader(...).unbatched().shuffle(1000).batched(64).with_epoch(n)``.
Only the import differs from the webdataset version, plus the two lines
marked ``# resumewds:`` that put the loader's state into the checkpoint and
load it back.  Kill it with SIGKILL and rerun it: it continues with exactly
the batches the uninterrupted run would have trained on.

Run::

    python examples/wds_train.py --work /tmp/wt --make-data --epochs 2 &
    sleep 5; kill -9 %1
    python examples/wds_train.py --work /tmp/wt --epochs 2     # continues at the next batch

Each step prints ``step N epoch E digest D``: D is the xxh3_64 of the
batch's labels and pixels, so two runs trained on the same batches print the
same lines.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch
import xxhash

import resumewds as wds  # was: import webdataset as wds


def identity(x):
    return x


def preprocess(img):
    return torch.from_numpy(np.asarray(img.convert("RGB").resize((16, 16)), dtype=np.float32) / 255.0)


def make_loader(urls, batch_size, workers, batches_per_epoch):
    dataset = (
        wds.WebDataset(urls, resampled=True, shardshuffle=True, nodesplitter=wds.split_by_node, seed=17)
        .shuffle(1000)
        .decode("pil")
        .to_tuple("jpg;png", "cls")
        .map_tuple(preprocess, identity)
        .batched(batch_size, partial=False)
    )
    loader = wds.WebLoader(dataset, batch_size=None, num_workers=workers)
    loader = loader.unbatched().shuffle(1000).batched(batch_size).with_epoch(batches_per_epoch)
    return loader


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", required=True)
    ap.add_argument("--make-data", action="store_true", help="write 8 shards of 48 images first")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batches", type=int, default=6, help="batches per epoch (with_epoch)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--step-delay", type=float, default=0.0)
    args = ap.parse_args(argv)
    data = os.path.join(args.work, "data")
    if args.make_data and not os.path.exists(data):
        from resumewds.synth import write_shards

        write_shards(data, shards=8, samples=48, images=True, image_side=24)
    urls = os.path.join(data, "shard-{000000..000007}.tar")
    os.environ.setdefault("RESUMEWDS_CACHE_DIR", os.path.join(args.work, "cache"))

    torch.manual_seed(0)
    model = torch.nn.Linear(16 * 16 * 3, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = make_loader(urls, args.batch_size, args.workers, args.batches)
    ckpt = os.path.join(args.work, "ckpt.pt")
    epoch, step = 0, 0
    if os.path.exists(ckpt):
        ck = torch.load(ckpt, weights_only=False)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        epoch, step = ck["epoch"], ck["step"]
        loader.load_state_dict(ck["loader"])  # resumewds: the data position
        print(f"resume step {step} epoch {epoch}", flush=True)

    while epoch < args.epochs:
        for images, labels in loader:
            labels = torch.as_tensor(labels)
            loss = torch.nn.functional.cross_entropy(model(images.reshape(len(images), -1)), labels % 10)
            opt.zero_grad()
            loss.backward()
            opt.step()
            digest = xxhash.xxh3_64(labels.numpy().tobytes() + images.numpy().tobytes()).hexdigest()
            print(f"step {step} epoch {epoch} digest {digest}", flush=True)
            step += 1
            state = {"model": model.state_dict(), "opt": opt.state_dict(), "epoch": epoch, "step": step,
                     "loader": loader.state_dict()}  # resumewds: the data position
            torch.save(state, ckpt + ".tmp")
            os.replace(ckpt + ".tmp", ckpt)
            time.sleep(args.step_delay)
        epoch += 1
        ck = {"model": model.state_dict(), "opt": opt.state_dict(), "epoch": epoch, "step": step,
              "loader": loader.state_dict()}
        torch.save(ck, ckpt + ".tmp")
        os.replace(ckpt + ".tmp", ckpt)
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
