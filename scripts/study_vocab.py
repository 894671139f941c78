"""The study's data (scripts/study.sh): the embedded corpus with its vocabulary cut to the K - 1 most frequent
token ids of the training split plus one id for every other token.

    study_vocab.py TRAIN_SHARDS VALID_SHARDS OUT_DIR --vocab K

Why: at dolma2's 100,278 ids the output layer is nearly all of a small model's cost, and in the few hundred
thousand tokens a CPU trains in minutes every topology only learns the unigram distribution, where the
normalization topology cannot matter. With K ids the blocks do the work. Token ids are renumbered by
frequency (0 = the most frequent; ties by id), so the mapping is a pure function of the training split.
Writes OUT_DIR/train and OUT_DIR/valid as token shards (archspace-token-shards/1) and OUT_DIR/vocab.json
(the kept dolma2 ids in order, the share of tokens each split sends to the "other" id, and the unigram
validation loss: what a model that ignores context reaches).
"""
import argparse
import hashlib
import json
import os

import numpy as np


def read_split(shard_dir):
    manifest = json.load(open(os.path.join(shard_dir, "manifest.json")))
    parts = [np.fromfile(os.path.join(shard_dir, s["file"]), dtype="<u4") for s in manifest["shards"]]  # raw, as OLMo
    return manifest, parts


def write_split(out_dir, source_manifest, parts, tokenizer):
    os.makedirs(out_dir, exist_ok=True)
    shards = []
    for src, tokens in zip(source_manifest["shards"], parts):
        path = os.path.join(out_dir, src["file"])
        tokens.astype("<u4").tofile(path)
        digest = hashlib.sha256(open(path, "rb").read()).hexdigest()
        shards.append({"file": src["file"], "tokens": int(tokens.size), "documents": src["documents"],
                       "sha256": digest})
    manifest = {"format": "archspace-token-shards/1", "dtype": "uint32", "byte_order": "little",
                "tokenizer": tokenizer, "shards": shards, "sources": source_manifest.get("sources", []),
                "total_tokens": sum(s["tokens"] for s in shards),
                "total_documents": sum(s["documents"] for s in shards)}
    with open(os.path.join(out_dir, "manifest.json.tmp"), "w") as f:
        json.dump(manifest, f, indent=2)
    os.replace(os.path.join(out_dir, "manifest.json.tmp"), os.path.join(out_dir, "manifest.json"))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("train")
    parser.add_argument("valid")
    parser.add_argument("out")
    parser.add_argument("--vocab", type=int, required=True, help="K: the K - 1 most frequent ids + one other id")
    args = parser.parse_args()
    k = args.vocab
    train_manifest, train = read_split(args.train)
    valid_manifest, valid = read_split(args.valid)
    eos = train_manifest["tokenizer"]["eos_token_id"]

    counts = np.bincount(np.concatenate(train), minlength=train_manifest["tokenizer"]["vocab_size"])
    order = np.lexsort((np.arange(counts.size), -counts))  # most frequent first, ties by id
    kept = order[:k - 1]
    if eos not in kept:  # documents stay separated: EOS always keeps its own id
        kept = np.concatenate([kept[:-1], [eos]])
    mapping = np.full(counts.size, k - 1, dtype=np.uint32)
    mapping[kept] = np.arange(kept.size, dtype=np.uint32)

    tokenizer = {"name": f"dolma2 top-{k - 1} ids + other (scripts/study_vocab.py)",
                 "sha256": hashlib.sha256(kept.astype(np.int64).tobytes()).hexdigest(),
                 "vocab_size": k, "eos_token_id": int(mapping[eos])}
    # The loss of a model that ignores context: the validation tokens' cross-entropy under the training split's
    # unigram distribution (add-one smoothed), the plateau a topology that fails to train stays at.
    train_counts = np.bincount(np.concatenate([mapping[p] for p in train]), minlength=k).astype(np.float64) + 1.0
    valid_ids = np.concatenate([mapping[p] for p in valid])
    unigram_loss = float(-np.log(train_counts / train_counts.sum())[valid_ids].mean())
    other_share = {}
    for name, manifest, parts in (("train", train_manifest, train), ("valid", valid_manifest, valid)):
        mapped = [mapping[p] for p in parts]
        write_split(os.path.join(args.out, name), manifest, mapped, tokenizer)
        total = sum(m.size for m in mapped)
        other_share[name] = float(sum(int((m == k - 1).sum()) for m in mapped) / total)
    with open(os.path.join(args.out, "vocab.json"), "w") as f:
        json.dump({"vocab_size": k, "other_id": k - 1, "eos_id": int(mapping[eos]),
                   "other_share": other_share, "unigram_valid_loss": unigram_loss, "dolma2_ids": kept.tolist()}, f)
    print(f"[study] vocabulary {k}: {100 * other_share['train']:.1f}% of training tokens and "
          f"{100 * other_share['valid']:.1f}% of validation tokens map to the other id; unigram validation loss "
          f"{unigram_loss:.4f} -> {args.out}")


if __name__ == "__main__":
    main()
