#!/usr/bin/python3
"""Counts test results per build configuration and prints the closing lines of scripts/test.

  count_results.py [--build-failed NAME]... NAME=BUILD_DIR | NAME ...
(a bare NAME is a configuration that did not build; configurations print in argument order)

Each (test case, configuration) counts once. A gtest binary (its meson env sets GTEST_OUTPUT)
counts each case of the XML it wrote: failed, skipped (GTEST_SKIP) or passed; a gtest binary
that crashed or timed out before writing its XML counts as one failure, and one whose XML
shows only passes but whose process failed (a sanitizer report at exit, a crash in teardown)
counts one more failure. Any other test (a script, a conformance run) counts once: OK passes,
exit 77 (meson SKIP) is a skip, anything else fails. A configuration that could not build,
or whose tests never ran, counts one failure.

Output: every failed test by name, every skipped test by name, then one line per configuration
"NAME: N passed, N failed, N skipped", "total: ...", and last the plain "N passed, N failed".
"""
import argparse
import json
import os
import sys
import xml.etree.ElementTree as ET


class Tally:
    def __init__(self, name):
        self.name = name
        self.passed = self.failed = self.skipped = 0
        self.failures = []  # "config: test (why)"
        self.skips = []

    def fail(self, what):
        self.failed += 1
        self.failures.append(f"{self.name}: {what}")

    def skip(self, what):
        self.skipped += 1
        self.skips.append(f"{self.name}: {what}")


def gtest_xml(env):
    out = (env or {}).get("GTEST_OUTPUT", "")
    if not out.startswith("xml:"):
        return None
    return out[len("xml:"):]


def count_gtest(tally, test, xml_path):
    """Adds the cases of one gtest XML file; returns how many cases failed."""
    failed = 0
    root = ET.parse(xml_path).getroot()
    for case in root.iter("testcase"):
        name = f"{test} {case.get('classname')}.{case.get('name')}"
        if case.find("failure") is not None or case.find("error") is not None:
            msg = case.find("failure")
            msg = msg if msg is not None else case.find("error")
            text = " | ".join(l.strip() for l in (msg.get("message") or "").splitlines() if l.strip())
            tally.fail(name + (f" ({text[:200]})" if text else ""))
            failed += 1
        elif (case.get("status") == "notrun" or case.get("result") == "skipped"
              or case.find("skipped") is not None):
            sk = case.find("skipped")
            why = (sk.get("message") or "").strip().splitlines() if sk is not None else []
            tally.skip(name + (f" ({why[-1][:160]})" if why else ""))
        else:
            tally.passed += 1
    return failed


def count_dir(tally, d):
    log = os.path.join(d, "meson-logs", "testlog.json")
    if not os.path.exists(log):
        tally.fail(f"no test log in {d} (tests did not run)")
        return
    with open(log) as f:
        for line in f:
            t = json.loads(line)
            test = t["name"].split(" / ")[-1]  # "project:suite / test"
            result = t["result"]
            ok = result in ("OK", "EXPECTEDFAIL")
            why = f"{result}, exit {t.get('returncode')}"
            xml = gtest_xml(t.get("env"))
            if xml is not None:
                try:
                    have_xml = os.path.getsize(xml) > 0
                except OSError:
                    have_xml = False
                if not have_xml:
                    tally.fail(f"{test} ({why}: no gtest XML written - crashed or hung before the end)")
                    continue
                try:
                    nfail = count_gtest(tally, test, xml)
                except ET.ParseError as e:
                    tally.fail(f"{test} ({why}: unreadable gtest XML: {e})")
                    continue
                if not ok and nfail == 0:
                    tally.fail(f"{test} ({why} although every case passed: sanitizer report, "
                               "crash at exit or timeout - see its log)")
            elif result == "SKIP":
                tally.skip(f"{test} (exit 77)")
            elif ok:
                tally.passed += 1
            else:
                tally.fail(f"{test} ({why})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-failed", action="append", default=[], metavar="NAME",
                    help="a configuration that could not be set up or built")
    ap.add_argument("configs", nargs="*", metavar="NAME=BUILD_DIR|NAME")
    a = ap.parse_args()
    tallies = []
    for c in a.configs + a.build_failed:
        name, eq, d = c.partition("=")
        t = Tally(name)
        if eq:
            count_dir(t, d)
        else:
            t.fail("configuration did not build (see the build log above)")
        tallies.append(t)
    for t in tallies:
        for s in t.skips:
            print(f"SKIPPED {s}")
    for t in tallies:
        for s in t.failures:
            print(f"FAILED  {s}")
    for t in tallies:
        print(f"{t.name}: {t.passed} passed, {t.failed} failed, {t.skipped} skipped")
    p = sum(t.passed for t in tallies)
    fl = sum(t.failed for t in tallies)
    sk = sum(t.skipped for t in tallies)
    print(f"total: {p} passed, {fl} failed, {sk} skipped")
    print(f"{p} passed, {fl} failed")
    return 1 if fl else 0


if __name__ == "__main__":
    sys.exit(main())
