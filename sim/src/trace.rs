//! The trace format: CSV with header `time_ms,function,exec_ms,mem_mb` and optional columns
//! `cold_ms,tenant,weight,util,bw`, one row per invocation, sorted by `time_ms`.
//!
//! - `exec_ms`: the invocation's solo, warm GPU time (> 0).
//! - `mem_mb`: the function container's GPU memory footprint (the largest value seen per function
//!   is its footprint).
//! - `cold_ms`: cold-start time of the function (else the simulator's default).
//! - `tenant`, `weight`: per function (first row that gives them wins; a later row that disagrees
//!   is an error, since it is almost surely a mistake in the trace).
//! - `util`: fraction of the GPU's compute one solo invocation keeps busy, in (0, 1] (default 1).
//! - `bw`: fraction of a solo invocation's time bound by memory bandwidth rather than compute, in
//!   [0, 1] (default 0): on a GPU model other than the reference, that share scales with memory
//!   bandwidth and the rest with FLOPS (`--gpu-models`).
//!
//! Parsing takes text and never panics: every problem is a [`TraceError`] with its line number.

use std::collections::HashMap;
use std::fmt::Write as _;

/// A problem in a trace, with the 1-based line it is on (0 for the file as a whole).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct TraceError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

fn err(line: usize, message: impl Into<String>) -> TraceError {
    TraceError {
        line,
        message: message.into(),
    }
}

/// One function of the trace.
#[derive(Clone, Debug, PartialEq)]
pub struct Function {
    /// Its name (the flow key).
    pub name: String,
    /// GPU memory footprint of one container, MB.
    pub mem_mb: f64,
    /// Cold-start time, if the trace gives one.
    pub cold_ms: Option<f64>,
    /// Tenant, if given.
    pub tenant: Option<String>,
    /// Fair-share weight (default 1).
    pub weight: f64,
    /// Solo GPU utilization in (0, 1] (default 1).
    pub util: f64,
    /// Share of its time bound by memory bandwidth, in [0, 1] (default 0).
    pub bw: f64,
}

/// One invocation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Invocation {
    /// Arrival, ms from trace start.
    pub arrival_ms: f64,
    /// Index into [`Trace::functions`].
    pub func: usize,
    /// Solo warm GPU time, ms.
    pub exec_ms: f64,
}

/// A parsed trace.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Trace {
    /// Functions, in order of first appearance.
    pub functions: Vec<Function>,
    /// Invocations, sorted by arrival.
    pub invocations: Vec<Invocation>,
}

const REQUIRED: [&str; 4] = ["time_ms", "function", "exec_ms", "mem_mb"];
const OPTIONAL: [&str; 5] = ["cold_ms", "tenant", "weight", "util", "bw"];

fn number(line: usize, col: &str, raw: &str) -> Result<f64, TraceError> {
    let v: f64 = raw
        .trim()
        .parse()
        .map_err(|_| err(line, format!("column `{col}`: `{raw}` is not a number")))?;
    if !v.is_finite() {
        return Err(err(line, format!("column `{col}`: `{raw}` is not finite")));
    }
    Ok(v)
}

impl Trace {
    /// Parses a trace from CSV text.
    ///
    /// # Errors
    /// [`TraceError`] with the line number for a missing or unknown column, a wrong field count, a
    /// value that is not a number or out of range, rows out of time order, a per-function value
    /// that contradicts an earlier row, or a trace without rows.
    #[expect(
        clippy::too_many_lines,
        reason = "one pass: the header, then each row checked against the rows before it"
    )]
    pub fn parse(text: &str) -> Result<Trace, TraceError> {
        let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l));
        let (hline, header) = lines
            .by_ref()
            .find(|(_, l)| !l.trim().is_empty())
            .ok_or_else(|| {
                err(
                    0,
                    "empty trace: expected a header `time_ms,function,exec_ms,mem_mb`",
                )
            })?;
        let cols: Vec<&str> = header.split(',').map(str::trim).collect();
        let mut index: HashMap<&str, usize> = HashMap::new();
        for (i, c) in cols.iter().enumerate() {
            if !REQUIRED.contains(c) && !OPTIONAL.contains(c) {
                return Err(err(
                    hline,
                    format!(
                        "unknown column `{c}` (known: {}, {})",
                        REQUIRED.join(","),
                        OPTIONAL.join(",")
                    ),
                ));
            }
            if index.insert(c, i).is_some() {
                return Err(err(hline, format!("column `{c}` appears twice")));
            }
        }
        for r in REQUIRED {
            if !index.contains_key(r) {
                return Err(err(hline, format!("missing required column `{r}`")));
            }
        }
        let col = |name: &str| index.get(name).copied();
        let mut trace = Trace::default();
        let mut by_name: HashMap<String, usize> = HashMap::new();
        let mut last_time = 0.0f64;
        for (ln, raw) in lines {
            if raw.trim().is_empty() {
                continue;
            }
            let fields: Vec<&str> = raw.split(',').map(str::trim).collect();
            if fields.len() != cols.len() {
                return Err(err(
                    ln,
                    format!("expected {} fields, found {}", cols.len(), fields.len()),
                ));
            }
            let get = |name: &str| col(name).map(|i| fields[i]);
            let time = number(ln, "time_ms", get("time_ms").unwrap_or_default())?;
            if time < 0.0 {
                return Err(err(ln, format!("column `time_ms`: {time} is negative")));
            }
            if time < last_time {
                return Err(err(
                    ln,
                    format!("rows must be sorted by time_ms: {time} comes after {last_time}"),
                ));
            }
            last_time = time;
            let name = get("function").unwrap_or_default();
            if name.is_empty() {
                return Err(err(ln, "column `function` is empty"));
            }
            let exec = number(ln, "exec_ms", get("exec_ms").unwrap_or_default())?;
            if exec <= 0.0 {
                return Err(err(ln, format!("column `exec_ms`: {exec} must be > 0")));
            }
            let mem = number(ln, "mem_mb", get("mem_mb").unwrap_or_default())?;
            if mem < 0.0 {
                return Err(err(ln, format!("column `mem_mb`: {mem} is negative")));
            }
            let opt_num = |c: &str| -> Result<Option<f64>, TraceError> {
                match get(c) {
                    Some(s) if !s.is_empty() => number(ln, c, s).map(Some),
                    _ => Ok(None),
                }
            };
            let cold = opt_num("cold_ms")?;
            if let Some(c) = cold
                && c < 0.0
            {
                return Err(err(ln, format!("column `cold_ms`: {c} is negative")));
            }
            let weight = opt_num("weight")?;
            if let Some(w) = weight
                && w <= 0.0
            {
                return Err(err(ln, format!("column `weight`: {w} must be > 0")));
            }
            let util = opt_num("util")?;
            if let Some(u) = util
                && !(u > 0.0 && u <= 1.0)
            {
                return Err(err(ln, format!("column `util`: {u} must be in (0, 1]")));
            }
            let bw = opt_num("bw")?;
            if let Some(b) = bw
                && !(0.0..=1.0).contains(&b)
            {
                return Err(err(ln, format!("column `bw`: {b} must be in [0, 1]")));
            }
            let tenant = get("tenant").filter(|s| !s.is_empty()).map(str::to_owned);
            let func = match by_name.get(name) {
                Some(&i) => {
                    let f = &mut trace.functions[i];
                    f.mem_mb = f.mem_mb.max(mem);
                    if f.cold_ms.is_none() {
                        f.cold_ms = cold;
                    }
                    check_same(ln, name, "weight", weight, f.weight, 1.0)?;
                    check_same(ln, name, "util", util, f.util, 1.0)?;
                    check_same(ln, name, "bw", bw, f.bw, 0.0)?;
                    if tenant.is_some() && f.tenant.is_some() && tenant != f.tenant {
                        return Err(err(
                            ln,
                            format!("function `{name}`: tenant differs from an earlier row"),
                        ));
                    }
                    if f.tenant.is_none() {
                        f.tenant = tenant;
                    }
                    if let Some(w) = weight {
                        f.weight = w;
                    }
                    if let Some(u) = util {
                        f.util = u;
                    }
                    if let Some(b) = bw {
                        f.bw = b;
                    }
                    i
                }
                None => {
                    trace.functions.push(Function {
                        name: name.to_owned(),
                        mem_mb: mem,
                        cold_ms: cold,
                        tenant,
                        weight: weight.unwrap_or(1.0),
                        util: util.unwrap_or(1.0),
                        bw: bw.unwrap_or(0.0),
                    });
                    by_name.insert(name.to_owned(), trace.functions.len() - 1);
                    trace.functions.len() - 1
                }
            };
            trace.invocations.push(Invocation {
                arrival_ms: time,
                func,
                exec_ms: exec,
            });
        }
        if trace.invocations.is_empty() {
            return Err(err(hline, "trace has a header but no invocations"));
        }
        Ok(trace)
    }

    /// Writes the trace back as CSV (all columns), e.g. for generated traces.
    #[must_use]
    pub fn to_csv(&self) -> String {
        let mut out =
            String::from("time_ms,function,exec_ms,mem_mb,cold_ms,tenant,weight,util,bw\n");
        for inv in &self.invocations {
            let f = &self.functions[inv.func];
            let cold = f.cold_ms.map(|c| format!("{c}")).unwrap_or_default();
            let _ = writeln!(
                out,
                "{:.3},{},{:.3},{},{},{},{},{},{}",
                inv.arrival_ms,
                f.name,
                inv.exec_ms,
                f.mem_mb,
                cold,
                f.tenant.as_deref().unwrap_or(""),
                f.weight,
                f.util,
                f.bw
            );
        }
        out
    }
}

/// A per-function value given on two rows must agree (an absent value agrees with anything).
fn check_same(
    ln: usize,
    name: &str,
    col: &str,
    new: Option<f64>,
    old: f64,
    default: f64,
) -> Result<(), TraceError> {
    match new {
        Some(v) if (v - old).abs() > 1e-12 && (old - default).abs() > 1e-12 => Err(err(
            ln,
            format!("function `{name}`: {col} {v} differs from {old} on an earlier row"),
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_required_and_optional_columns() {
        let t = Trace::parse(
            "time_ms,function,exec_ms,mem_mb,weight,tenant\n\
             0,a,20,100,2,t1\n\
             5,b,2000,3000,,\n\
             5,a,25,120,2,t1\n",
        )
        .unwrap();
        assert_eq!(t.functions.len(), 2);
        assert_eq!(t.functions[0].mem_mb, 120.0);
        assert_eq!(t.functions[0].weight, 2.0);
        assert_eq!(t.functions[0].tenant.as_deref(), Some("t1"));
        assert_eq!(t.functions[1].weight, 1.0);
        assert_eq!(t.invocations[2].func, 0);
        let again = Trace::parse(&t.to_csv()).unwrap();
        assert_eq!(again.invocations, t.invocations);
        assert_eq!(again.functions, t.functions);
    }

    #[test]
    fn errors_carry_line_numbers() {
        let cases = [
            ("", 0, "empty trace"),
            (
                "time_ms,function,exec_ms\n0,a,1\n",
                1,
                "missing required column `mem_mb`",
            ),
            (
                "time_ms,function,exec_ms,mem_mb,colour\n",
                1,
                "unknown column `colour`",
            ),
            ("time_ms,function,exec_ms,mem_mb\n", 1, "no invocations"),
            (
                "time_ms,function,exec_ms,mem_mb\n0,a,1\n",
                2,
                "expected 4 fields",
            ),
            ("time_ms,function,exec_ms,mem_mb\n-1,a,1,1\n", 2, "negative"),
            (
                "time_ms,function,exec_ms,mem_mb\n5,a,1,1\n\n3,a,1,1\n",
                4,
                "sorted",
            ),
            (
                "time_ms,function,exec_ms,mem_mb\n0,a,x,1\n",
                2,
                "`x` is not a number",
            ),
            (
                "time_ms,function,exec_ms,mem_mb\n0,a,0,1\n",
                2,
                "must be > 0",
            ),
            (
                "time_ms,function,exec_ms,mem_mb\n0,,1,1\n",
                2,
                "`function` is empty",
            ),
            (
                "time_ms,function,exec_ms,mem_mb,util\n0,a,1,1,2\n",
                2,
                "util",
            ),
            (
                "time_ms,function,exec_ms,mem_mb,weight\n0,a,1,1,0\n",
                2,
                "weight",
            ),
            (
                "time_ms,function,exec_ms,mem_mb,weight\n0,a,1,1,2\n1,a,1,1,3\n",
                3,
                "differs",
            ),
            (
                "time_ms,function,exec_ms,mem_mb\n0,a,NaN,1\n",
                2,
                "not finite",
            ),
        ];
        for (text, line, needle) in cases {
            let e = Trace::parse(text).unwrap_err();
            assert_eq!(e.line, line, "{text:?}: {e}");
            assert!(e.to_string().contains(needle), "{text:?}: {e}");
        }
    }
}
