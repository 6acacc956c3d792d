"""Write a synthetic image-folder data set with PIL and prepare it with the trainer's own prep.

Under ``--root``: the PNGs in ``data/images/class_<k>/``, and what ``trainer.prep`` makes of them
(``work/datasets/<fingerprint>/`` and the run's pointer ``work/runs/bench/prep/dataset.json``). The
classes differ by colour and by a bright square in a class-specific corner, so a small CNN learns
something and training is not a degenerate no-op.
"""

import os
import time

import util


def write_pngs(root, count, size, channels, classes, seed):
    import numpy as np
    from PIL import Image

    rng = np.random.RandomState(seed)
    for n in range(count):
        k = n % classes
        folder = os.path.join(root, "class_%d" % k)
        os.makedirs(folder, exist_ok=True)
        base = rng.randint(0, 96, size=(size, size, channels)).astype(np.int32)
        base[..., k % channels] += 40 + 10 * k  # class colour cast
        q = size // 4
        corner = [(0, 0), (0, size - q), (size - q, 0), (size - q, size - q)][k % 4]
        base[corner[0]:corner[0] + q, corner[1]:corner[1] + q, :] += 100
        pixels = np.clip(base, 0, 255).astype(np.uint8)
        image = Image.fromarray(pixels if channels == 3 else pixels[..., 0], "RGB" if channels == 3 else "L")
        image.save(os.path.join(folder, "img_%05d.png" % n))


def main():
    parser = util.arguments(__doc__)
    parser.add_argument("--count", type=int, default=1200)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--channels", type=int, default=3)
    args = parser.parse_args()

    started = time.time()
    images = os.path.join(args.root, "data", "images")
    write_pngs(images, args.count, args.size, args.channels, classes=4, seed=7)
    png_s = time.time() - started

    from trainer import prep

    config = util.stage_config(args.root, "prep", dag_id="bench", run_id="prep",
                               data=util.image_data_section(args.size, args.channels))
    result = prep.run(config)
    util.emit({"dataset_dir": result["dataset_dir"], "fingerprint": result["fingerprint"],
               "examples": result["examples"], "pngs": args.count, "png_seconds": round(png_s, 2),
               "seconds": round(time.time() - started, 2)})


if __name__ == "__main__":
    main()
