"""``pyg-sar train``: full-batch distributed training of a stock PyG model
on a partition (run under ``torchrun``, one worker per part)."""
import argparse
import json
import os

from pyg_sar.cli.registry import register_command

# The models of :func:`pyg_sar.train.train` (kept here so that building the
# parser imports no torch; tests/train/test_trust_checkpoint.py checks that the two
# are equal).
MODELS = ('sage', 'gcn', 'gat', 'gatv2', 'transformer', 'gen')


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument('--parts', required=True,
                        help='partition directory (pyg-sar partition)')
    parser.add_argument('--model', choices=MODELS, default='sage')
    parser.add_argument('--layers', type=int, default=3)
    parser.add_argument('--hidden', type=int, default=256)
    parser.add_argument('--heads', type=int, default=4,
                        help='attention heads (gat, gatv2, transformer)')
    parser.add_argument('--epochs', type=int, default=10)
    parser.add_argument('--lr', type=float, default=0.01)
    parser.add_argument('--dropout', type=float, default=0.5)
    parser.add_argument('--mode', choices=('sar', 'sa', 'one_shot'),
                        default='sar')
    parser.add_argument('--chunk-size', type=int, default=None,
                        help='edges per aggregation chunk (bounds memory)')
    parser.add_argument('--pipeline-depth', type=int, default=1)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--device', default='auto',
                        help="'auto' (this worker's GPU when CUDA is "
                        "available, else the CPU), 'cpu' or 'cuda[:N]'")
    parser.add_argument('--timeout', type=float, default=300.0,
                        help='seconds before a silent peer is an error')
    parser.add_argument('--history', default=None,
                        help='write the per-epoch history here (JSON)')
    parser.add_argument('--no-progress', action='store_true')
    parser.add_argument('--checkpoint-dir', default=None,
                        help='save checkpoints here and resume from the '
                        'newest intact one (each is verified against the '
                        'hashes it records; a corrupt one is reported and '
                        'set aside as epoch-K.corrupt)')
    parser.add_argument('--checkpoint-every', type=int, default=None,
                        metavar='K', help='epochs between checkpoints '
                        '(default 1; the last epoch is always saved)')
    parser.add_argument('--keep-last', type=int, default=None, metavar='K',
                        help='keep only the K newest checkpoints (older ones '
                        'are deleted once a new one is complete)')
    parser.add_argument('--log-dir', default=None, metavar='DIR',
                        help='write per-epoch metrics.csv (loss, accuracies, '
                        'time, bytes and peak RSS per rank) and curves.png')
    parser.add_argument('--allow-non-finite-loss', action='store_true',
                        help='keep training when the loss is NaN or inf '
                        '(default: stop with an error naming the epoch)')
    parser.add_argument('--save-model', default=None, metavar='PATH',
                        help='write the trained weights here (state_dict '
                        'of the stock PyG model)')


def _run(args: argparse.Namespace) -> int:
    from pyg_sar import comm
    from pyg_sar.train import train
    from pyg_sar.train.files import check_output_file, write_text_atomically

    for option in ('checkpoint_every', 'keep_last'):
        value, flag = getattr(args, option), '--' + option.replace('_', '-')
        if value is not None and args.checkpoint_dir is None:
            raise ValueError(f"{flag} {value} needs --checkpoint-dir")
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be >= 1 (got {value})")
    # Rank 0 writes the history: find out now, not after the last epoch.
    if args.history and os.environ.get('RANK', '0') == '0':
        check_output_file(args.history, '--history')
    history = train(args.parts, args.model, args.layers, args.hidden,
                    args.heads, args.epochs, args.lr, args.dropout, args.mode,
                    args.chunk_size, args.pipeline_depth, args.seed,
                    args.timeout, not args.no_progress,
                    checkpoint_dir=args.checkpoint_dir,
                    checkpoint_every=(1 if args.checkpoint_every is None
                                      else args.checkpoint_every),
                    save_model=args.save_model,
                    allow_non_finite_loss=args.allow_non_finite_loss,
                    log_dir=args.log_dir, device=args.device,
                    keep_last=args.keep_last)
    if args.history and comm.get_rank() == 0:
        write_text_atomically(args.history, json.dumps(history, indent=1))
    if history and comm.get_rank() == 0:
        final = history[-1]
        print('final: ' + '  '.join(
            f'{k} {v:.4f}' for k, v in final.items()
            if k.endswith(('_acc', 'loss'))))
        evaluated = [r for r in history if 'val_acc' in r]
        if evaluated:
            best = max(evaluated, key=lambda r: r['val_acc'])
            print(f"best val: epoch {best['epoch']}  val_acc "
                  f"{best['val_acc']:.4f}  test_acc {best['test_acc']:.4f}")
    comm.shutdown()
    return 0


register_command('train', 'Full-batch distributed training (run under '
                 'torchrun, one worker per part)', _configure, _run)
