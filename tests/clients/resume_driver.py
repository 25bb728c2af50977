"""One training run of a client pipeline on resumewds, for the resume checks (run as a script).

``python -m tests.clients.resume_driver NAME URLS WORKDIR TOTAL KILL_AT``

Walks the client's loader epoch after epoch until TOTAL items were trained
on, writing one line per item (``step digest``) to WORKDIR/out.txt. The
client code is changed only where the documented resume needs it:

* ``journal``: ``WebLoader(..., journal=WORKDIR/journal.db, resume=True)`` and
  ``loader.commit(step)`` after each step (the loop starts at
  ``loader.steps_done``);
* ``state``: the dataset's ``state_dict()`` saved with each step's checkpoint,
  ``load_state_dict()`` before the loop when a checkpoint exists.

With KILL_AT >= 0, the process SIGKILLs itself once it holds the item of
step KILL_AT, before that step is trained on or committed: an interrupted
run, mid-epoch, with a batch in flight.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import warnings

import resumewds
from tests.clients.harness import norm
from tests.clients.pipelines import SPEC

#: how each client resumes (pipelines absent here are "not tried")
RESUME = {
    "openclip_eval": "journal",
    "wds_train_example": "journal",
    "smoke_next_chain": "journal",  # the smoke test right after the journal's resume
    "dalle_pytorch": "journal",
    "stable_diffusion": "journal",
    "latents_npy": "journal",
    "video2dataset": "journal",
    "wds_readme": "state",
    "wds_datapipeline": "state",
    "clip_retrieval": "state",
    "lavis_laion": "state",
    "clip_benchmark": "state",
    "clap": "journal",
}
#: DataLoader workers of the journal runs (the state runs iterate in the process)
WORKERS = {"openclip_eval": 2, "video2dataset": 2}


def main(name: str, urls: str, workdir: str, total: int, kill_at: int) -> None:
    warnings.simplefilter("ignore")
    spec, mech = SPEC[name], RESUME[name]
    kw = dict(spec.kw or {})
    if name == "clip_retrieval":
        kw["cache_path"] = os.path.join(workdir, "clientcache")
        os.makedirs(kw["cache_path"], exist_ok=True)
    ckpt = os.path.join(workdir, "ckpt.pkl")
    if mech == "journal":
        kw["loader_kw"] = dict(journal=os.path.join(workdir, "journal.db"), resume=True)
    client = spec.build(resumewds, urls, workers=WORKERS.get(name, 0), **kw)
    loader = client.loader
    if mech == "journal":
        step = loader.steps_done
    else:
        step = 0
        if os.path.exists(ckpt):
            with open(ckpt, "rb") as f:
                saved = pickle.load(f)
            client.dataset.load_state_dict(saved["data"])
            step = saved["step"]
    with open(os.path.join(workdir, "out.txt"), "a") as out:
        while step < total:
            for item in loader:
                if step == kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)
                out.write(f"{step} {hash_of(item)}\n")
                out.flush()
                if mech == "journal":
                    loader.commit(step)
                else:
                    with open(ckpt + ".tmp", "wb") as f:
                        pickle.dump({"data": client.dataset.state_dict(), "step": step + 1}, f)
                    os.replace(ckpt + ".tmp", ckpt)
                step += 1
                if step >= total:
                    break
    if hasattr(loader, "close"):
        loader.close()


def hash_of(item) -> str:
    import hashlib

    return hashlib.sha1(repr(norm(item)).encode()).hexdigest()[:16]


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
