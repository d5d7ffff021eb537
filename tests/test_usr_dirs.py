"""--t2t_usr_dir for the project's tools: comma-separated user directories are imported after the
project's own, a user directory may share the name t2t_usr_dir, bad entries fail in one line."""
import os

import pytest

from routing_transformer.t2t import usr_dirs


def user_dir(root, folder, hparams_name, body=None):
  """A T2T user directory registering an hparams set `hparams_name` (a routing_transformer_test
  copy with filter_size 96), or with `body` as its __init__.py."""
  path = os.path.join(str(root), folder)
  os.makedirs(path)
  with open(os.path.join(path, "__init__.py"), "w") as f:
    f.write(body or (
        "from tensor2tensor.utils import registry\n"
        "from hparams import sets\n"
        "from . import helper\n\n\n"
        "@registry.register_hparams\n"
        "def %s():\n"
        "  h = sets.routing_transformer_test()\n"
        "  h.filter_size = helper.FILTER\n"
        "  return h\n" % hparams_name))
  with open(os.path.join(path, "helper.py"), "w") as f:
    f.write("FILTER = 96\n")
  return path


def test_user_hparams_sets_register_from_several_dirs(tmp_path):
  from tensor2tensor.utils import registry  # pylint: disable=g-import-not-at-top
  first = user_dir(tmp_path / "a", "t2t_usr_dir", "usr_dirs_test_set_a")  # same name as ours
  second = user_dir(tmp_path / "b", "my_dir", "usr_dirs_test_set_b")
  usr_dirs.import_usr_dirs(" %s, %s ,%s" % (first, usr_dirs.PROJECT_USR_DIR, second))
  assert registry.hparams("usr_dirs_test_set_a").filter_size == 96
  assert registry.hparams("usr_dirs_test_set_b").filter_size == 96
  assert registry.hparams("routing_transformer_tiny")  # the project's own sets stay registered
  usr_dirs.import_usr_dirs(first)  # importing again is a no-op, not a duplicate registration


def test_bad_entries_fail_in_one_line(tmp_path):
  with pytest.raises(usr_dirs.UsrDirError, match="is not a directory with an __init__.py"):
    usr_dirs.import_usr_dirs(str(tmp_path / "missing"))
  broken = user_dir(tmp_path, "broken", None, body="import no_such_module_here\n")
  with pytest.raises(usr_dirs.UsrDirError) as error:
    usr_dirs.import_usr_dirs(broken)
  assert "importing %s failed: ModuleNotFoundError" % broken in str(error.value)
  assert "\n" not in str(error.value) and usr_dirs.UsrDirError.one_line
  assert str(tmp_path) not in os.sys.path  # the parent left sys.path again
