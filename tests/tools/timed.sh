#!/bin/sh
# The test harness's wrapper of every test (LOG_COMPILER and
# SH_LOG_COMPILER in Makefile.am): runs the test with its arguments, adds
# its wall time to the end of its log as "# time: S s", and exits with the
# test's status (77 a skip, as automake reads it).
# usage: tests/tools/timed.sh TEST [ARGS...]
start=$(date +%s%N)
"$@"
rc=$?
end=$(date +%s%N)
echo "# time: $(((end - start) / 1000000 / 1000)).$(((end - start) / 100000000 % 10)) s"
exit $rc
