"""The host vectors through Go's regexp package: the RE2 engine that cel-go (the apiserver's CEL) uses."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from domain.hosts import HOST_MAX_LENGTH, HOSTNAME_RE, IPV4_RE, NUMERIC_NAME_RE
from tests.vectors.hosts import HOST_VECTORS

_GO_PROGRAM = """
package main

import (
\t"encoding/json"
\t"os"
\t"regexp"
\t"unicode/utf8"
)

func main() {
\tvar in struct {
\t\tIPv4, Hostname, Numeric string
\t\tMaxLen                  int
\t\tHosts                   []string
\t}
\tif err := json.NewDecoder(os.Stdin).Decode(&in); err != nil {
\t\tpanic(err)
\t}
\tip, hn, nu := regexp.MustCompile(in.IPv4), regexp.MustCompile(in.Hostname), regexp.MustCompile(in.Numeric)
\tout := []bool{}
\tfor _, h := range in.Hosts {
\t\tname := hn.MatchString(h) && !nu.MatchString(h)
\t\tout = append(out, utf8.RuneCountInString(h) <= in.MaxLen && (ip.MatchString(h) || name))
\t}
\t_ = json.NewEncoder(os.Stdout).Encode(out)
}
"""


def test_go_regexp_agrees_with_every_vector(tmp_path: Path) -> None:
    source = tmp_path / "main.go"
    source.write_text(_GO_PROGRAM)
    payload = {
        "IPv4": IPV4_RE,
        "Hostname": HOSTNAME_RE,
        "Numeric": NUMERIC_NAME_RE,
        "MaxLen": HOST_MAX_LENGTH,
        "Hosts": [h for h, _, _ in HOST_VECTORS],
    }
    env = {**os.environ, "GOFLAGS": "", "GOTOOLCHAIN": "local"}
    result = subprocess.run(  # fixed program, no shell
        ["go", "run", str(source)],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    got = json.loads(result.stdout)
    mismatches = [(h, ok, why) for (h, ok, why), g in zip(HOST_VECTORS, got, strict=True) if g is not ok]
    assert mismatches == []
