import json

import pytest

from pyg_sar import cli, load_partition


def test_partition_and_info(tmp_path, capsys):
    out_dir = str(tmp_path / 'parts')
    code = cli.main([
        'partition', '--dataset', 'synthetic', '--num-nodes', '2000',
        '--num-features', '8', '--num-parts', '2', '--out', out_dir
    ])
    assert code == 0
    printed = capsys.readouterr().out
    assert 'edge cut' in printed and 'balance' in printed
    assert 'time' in printed
    part = load_partition(out_dir, 1)
    assert part.num_nodes == 2000 and part.x.size(1) == 8

    # A second run into the same folder needs --overwrite.
    code = cli.main([
        'partition', '--dataset', 'synthetic', '--num-nodes', '2000',
        '--num-parts', '3', '--out', out_dir, '--method', 'random'
    ])
    assert code == 2
    assert 'not empty' in capsys.readouterr().err
    assert cli.main([
        'partition', '--dataset', 'synthetic', '--num-nodes', '2000',
        '--num-parts', '3', '--out', out_dir, '--method', 'random',
        '--overwrite'
    ]) == 0
    capsys.readouterr()

    assert cli.main(['info', out_dir]) == 0
    printed = capsys.readouterr().out
    assert 'random' in printed and 'halo nodes' in printed
    assert cli.main(['info', out_dir, '--json']) == 0
    manifest = json.loads(capsys.readouterr().out)
    assert manifest['num_parts'] == 3
    # One table row per part, with the manifest's numbers.
    rows = [line.split() for line in printed.splitlines()
            if line.split() and line.split()[0].isdigit()]
    assert len(rows) == 3
    for k, (row, part) in enumerate(zip(rows, manifest['parts'])):
        assert row == [str(k)] + [f"{part[key]:,}" for key in (
            'num_nodes', 'num_edges', 'num_train_nodes', 'num_remote_edges',
            'num_halo_nodes')], row


def test_info_on_missing_dir(tmp_path, capsys):
    assert cli.main(['info', str(tmp_path / 'nothing')]) == 2
    assert 'pyg_sar.json' in capsys.readouterr().err


def test_registry():
    assert {'partition', 'info'} <= set(cli.COMMANDS)
    with pytest.raises(ValueError, match='already registered'):
        cli.register_command('info', 'again', lambda p: None, lambda a: 0)
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(['no-such-command'])
