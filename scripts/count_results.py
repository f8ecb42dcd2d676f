#!/usr/bin/python3
"""Sums test results over meson build dirs and prints "N passed, N failed".

A gtest binary counts each of its test cases (from the XML it wrote into
<build>/test-xml/); any other test (a script, a conformance run) counts once.
A gtest binary that died before writing its XML counts as one failure.
"""
import argparse
import json
import os
import sys
import xml.etree.ElementTree as ET


def gtest_counts(xml_path):
    passed = failed = 0
    root = ET.parse(xml_path).getroot()
    for case in root.iter("testcase"):
        if case.get("status") == "notrun" or case.get("result") == "skipped":
            continue
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
        else:
            passed += 1
    return passed, failed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-failures", type=int, default=0)
    ap.add_argument("dirs", nargs="*")
    a = ap.parse_args()
    passed, failed = 0, a.build_failures
    for d in a.dirs:
        log = os.path.join(d, "meson-logs", "testlog.json")
        if not os.path.exists(log):
            failed += 1
            continue
        with open(log) as f:
            for line in f:
                t = json.loads(line)
                name = t["name"]
                ok = t["result"] in ("OK", "EXPECTEDFAIL")
                skipped = t["result"] == "SKIP"
                # testlog names read "project:suite / test"; the XML is named after the test.
                short = name.split(" / ")[-1]
                xml = os.path.join(d, "test-xml", short.replace("/", "_") + ".xml")
                if os.path.exists(xml):
                    p, fl = gtest_counts(xml)
                    if not ok and fl == 0:
                        fl = 1  # crashed or timed out after writing partial results
                    passed += p
                    failed += fl
                elif skipped:
                    continue
                elif ok:
                    passed += 1
                else:
                    failed += 1
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
