//! GPU allocation across the three stages, in the EAServe paper's notation.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Largest worker count or TP degree one term may give (so GPU totals cannot
/// overflow).
pub const MAX_TERM: u32 = 4096;

/// Workers of one stage, each spanning `tp` GPUs (tensor parallelism).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct StagePool {
    /// Number of workers (replicas).
    pub workers: u32,
    /// Tensor-parallel degree of each worker (GPUs per worker).
    pub tp: u32,
}

impl StagePool {
    /// GPUs the pool occupies: `workers · tp`.
    pub fn gpus(&self) -> u32 {
        self.workers * self.tp
    }
}

/// A GPU allocation `nE(TPa)+nP(TPb)+nD(TPc)` (EAServe §2.1, Table 2), e.g.
/// `2E(TP1)+1P(TP2)+1D(TP4)`: two encode workers on one GPU each, one remote
/// prefill worker over two GPUs, one decode worker over four.
///
/// A stage with zero workers is omitted from the notation: `1P(TP2)+1D(TP4)` is a
/// text-only prefill/decode deployment, `2E(TP1)+1D(TP4)` one whose prefill runs
/// entirely on local prefill workers (offload ratio `s = 0`). Local prefill
/// workers are not part of the notation: they are co-located on encode GPUs when
/// `s < 1` (see [`crate::Deployment`]).
///
/// Parsing accepts exactly this grammar, terms in E, P, D order:
/// `term ('+' term)*`, `term = COUNT ('E'|'P'|'D') '(TP' DEGREE ')'`, with COUNT ≥ 1
/// and DEGREE ≥ 1 decimal integers; [`fmt::Display`] prints the same text back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Allocation {
    /// Encode workers.
    pub encode: StagePool,
    /// Remote prefill workers.
    pub prefill: StagePool,
    /// Decode workers.
    pub decode: StagePool,
}

/// Why an allocation string did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid allocation `{text}`: {reason}; expected terms like `2E(TP1)+1P(TP2)+1D(TP4)` (count and TP degree in 1 ..= 4096, stage E, P or D in that order)")]
pub struct AllocationError {
    /// The text that failed to parse.
    pub text: String,
    /// What was wrong.
    pub reason: String,
}

impl Allocation {
    /// Total GPUs: `Σ workers · tp` over the three stages.
    pub fn gpus(&self) -> u32 {
        self.encode.gpus() + self.prefill.gpus() + self.decode.gpus()
    }

    /// An allocation from worker counts and TP degrees.
    pub fn new(e: (u32, u32), p: (u32, u32), d: (u32, u32)) -> Self {
        let pool = |(workers, tp)| StagePool { workers, tp };
        Allocation {
            encode: pool(e),
            prefill: pool(p),
            decode: pool(d),
        }
    }
}

impl fmt::Display for Allocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (letter, pool) in [('E', self.encode), ('P', self.prefill), ('D', self.decode)] {
            if pool.workers == 0 {
                continue;
            }
            if !first {
                f.write_str("+")?;
            }
            first = false;
            write!(f, "{}{}(TP{})", pool.workers, letter, pool.tp)?;
        }
        Ok(())
    }
}

fn parse_uint(s: &str, what: &str, text: &str) -> Result<u32, AllocationError> {
    let err = |reason: String| AllocationError {
        text: text.to_string(),
        reason,
    };
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(err(format!("{what} `{s}` is not a positive integer")));
    }
    let v: u32 = s
        .parse()
        .map_err(|_| err(format!("{what} `{s}` is too large")))?;
    if v == 0 || v > MAX_TERM {
        return Err(err(format!("{what} must be in 1 ..= {MAX_TERM}")));
    }
    Ok(v)
}

impl FromStr for Allocation {
    type Err = AllocationError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let err = |reason: &str| AllocationError {
            text: text.to_string(),
            reason: reason.to_string(),
        };
        let zero = StagePool { workers: 0, tp: 1 };
        let mut pools = [zero; 3];
        let mut last_stage: Option<usize> = None;
        if text.trim().is_empty() {
            return Err(err("it is empty"));
        }
        for term in text.trim().split('+') {
            let open = term.find('(').ok_or_else(|| err("a term lacks `(TPk)`"))?;
            let head = &term[..open];
            let tail = &term[open..];
            let letter = head
                .chars()
                .last()
                .ok_or_else(|| err("a term lacks its count and stage letter"))?;
            let stage = match letter {
                'E' => 0,
                'P' => 1,
                'D' => 2,
                _ => return Err(err(&format!("unknown stage `{letter}`"))),
            };
            if let Some(prev) = last_stage {
                if stage <= prev {
                    return Err(err("stages must appear once each, in E, P, D order"));
                }
            }
            last_stage = Some(stage);
            let count = parse_uint(&head[..head.len() - 1], "worker count", text)?;
            let degree = tail
                .strip_prefix("(TP")
                .and_then(|t| t.strip_suffix(')'))
                .ok_or_else(|| err(&format!("`{tail}` is not of the form `(TPk)`")))?;
            let tp = parse_uint(degree, "TP degree", text)?;
            pools[stage] = StagePool { workers: count, tp };
        }
        Ok(Allocation {
            encode: pools[0],
            prefill: pools[1],
            decode: pools[2],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paper_notation_round_trips() {
        for s in [
            "2E(TP1)+1P(TP2)+1D(TP4)",
            "3E(TP1)+1P(TP1)+2D(TP2)",
            "1P(TP2)+1D(TP4)",
            "2E(TP1)+1D(TP4)",
            "10E(TP1)+12P(TP8)+16D(TP16)",
        ] {
            let a: Allocation = s.parse().unwrap_or_else(|e| panic!("{s}: {e}"));
            assert_eq!(a.to_string(), s);
        }
        let a: Allocation = "2E(TP1)+1P(TP2)+1D(TP4)".parse().unwrap();
        assert_eq!(a.gpus(), 8);
        assert_eq!(a.encode, StagePool { workers: 2, tp: 1 });
        assert_eq!(a.prefill, StagePool { workers: 1, tp: 2 });
        assert_eq!(a.decode, StagePool { workers: 1, tp: 4 });
    }

    #[test]
    fn rejects_malformed() {
        for s in [
            "",
            "2E(TP1)+",
            "0E(TP1)+1D(TP1)",
            "2E(TP0)+1D(TP1)",
            "2X(TP1)",
            "1D(TP4)+2E(TP1)",
            "2E(TP1)+2E(TP1)",
            "E(TP1)",
            "2E(tp1)",
            "2E TP1",
            "2E(TP1)+1P(TP2)+1D(TP4))",
            "2147483648E(TP2)+1D(TP4)",
            "5000E(TP1)+1D(TP1)",
            "-1E(TP1)",
        ] {
            let e = s.parse::<Allocation>().expect_err(s);
            assert!(e.to_string().contains("expected terms like"), "{e}");
        }
    }
}
