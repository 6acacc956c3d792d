"""GPU section: ResNet-50 training throughput (images/s) in float32 and mixed_float16.

Runs inside the trainer image on a GPU (``docker run --gpus device=0 ...``). The model is
``resnet50`` from :mod:`trainer.models` (built through ``models.build_model``, so the float32
logits cast of mixed precision is the trainer's own), the optimizer comes from
``checkpoints.build_optimizer`` (a ``LossScaleOptimizer`` under mixed precision) and the step
mirrors ``trainer.train.Loop``'s (scaled loss, unscaled gradients). The data is synthetic:
random uint8 224x224x3 images and labels, resident on the GPU, so the number is the model's
compute throughput, not the input pipeline's.

For each policy: ``--warmup`` steps (tracing, cuDNN autotuning), then the line
``BENCH_STEADY start <policy>`` on stdout, ``--steps`` timed steps, ``BENCH_STEADY end <policy>``.
The host samples ``nvidia-smi --query-gpu=utilization.gpu`` between the two markers.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import util  # noqa: E402


def marker(what, policy):
    sys.stdout.flush()
    sys.stdout.write("BENCH_STEADY %s %s\n" % (what, policy))
    sys.stdout.flush()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", default="/bench", help="unused (uniform command line)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=15)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--policies", default="float32,mixed_float16")
    parser.add_argument("--allow-cpu", action="store_true",
                        help="run without a GPU (a smoke test of this script with tiny sizes)")
    args = parser.parse_args()

    from trainer import checkpoints, common, config as config_mod, models
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus and not args.allow_cpu:
        util.emit({"error": "TensorFlow sees no GPU inside the image (tf %s, built with CUDA: %s). "
                            "Is the container started with --gpus and the NVIDIA Container "
                            "Toolkit, and the image the GPU variant (not TFPIPE_IMAGE_VARIANT=cpu)?"
                            % (tf.__version__, tf.test.is_built_with_cuda())})
        return 0

    size = args.image_size
    schema = {"format": "images", "image": {"height": size, "width": size, "channels": 3},
              "class_names": ["c%d" % i for i in range(args.classes)],
              "num_classes": args.classes}
    results = {}
    for policy in [p.strip() for p in args.policies.split(",") if p.strip()]:
        mixed = policy == "mixed_float16"
        config = config_mod.resolve(util.stage_config(
            "/tmp/bench-gpu", "train", dag_id="bench_gpu", run_id=policy,
            data={"path": "images", "format": "images", "image_size": [size, size], "channels": 3},
            training={"model": "resnet50", "batch_size": args.batch_size,
                      "mixed_precision": mixed}))
        training = config["training"]
        tf.keras.backend.clear_session()
        common.setup_tensorflow(training)  # seeds, memory growth, the global dtype policy
        model = models.build_model(config, schema, {})
        optimizer = checkpoints.build_optimizer(training)
        loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

        @tf.function
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
                scaled = optimizer.get_scaled_loss(loss) if mixed else loss
            grads = tape.gradient(scaled, model.trainable_variables)
            if mixed:
                grads = optimizer.get_unscaled_gradients(grads)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        device = "/GPU:0" if gpus else "/CPU:0"
        with tf.device(device):
            x = tf.cast(tf.random.uniform([args.batch_size, size, size, 3], 0, 256, tf.int32),
                        tf.uint8)
            y = tf.random.uniform([args.batch_size], 0, args.classes, tf.int64)
        util.log("%s: warm-up %d steps (batch %d, %dx%d, %s)", policy, args.warmup,
                 args.batch_size, size, size, device)
        for _ in range(args.warmup):
            loss = step(x, y)
        float(loss.numpy())
        marker("start", policy)
        started = time.perf_counter()
        for _ in range(args.steps):
            loss = step(x, y)
        final_loss = float(loss.numpy())  # waits for the last step
        seconds = time.perf_counter() - started
        marker("end", policy)
        results[policy] = {"images_per_s": args.batch_size * args.steps / seconds,
                           "step_ms": 1000.0 * seconds / args.steps, "loss": final_loss}
        util.log("%s: %.1f images/s", policy, results[policy]["images_per_s"])
    util.emit({"policies": results, "batch_size": args.batch_size, "image_size": size,
               "steps": args.steps, "warmup": args.warmup,
               "gpus": [g.name for g in gpus], "tensorflow": tf.__version__})
    return 0


if __name__ == "__main__":
    sys.exit(main())
