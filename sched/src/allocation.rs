//! GPU allocation across the three stages, in the EAServe paper's notation.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Largest worker count or TP degree one term may give (so GPU totals cannot
/// overflow).
pub const MAX_TERM: u32 = 4096;

/// Workers of one stage, each spanning `tp · ep` GPUs: `ep` data-parallel
/// attention replicas of `tp` GPUs each (tensor parallelism), over which an
/// MoE model's experts are split (expert parallelism); `ep = 1` is plain TP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct StagePool {
    /// Number of workers (replicas).
    pub workers: u32,
    /// Tensor-parallel degree of each attention replica (and of each expert).
    pub tp: u32,
    /// Expert-parallel degree: attention replicas per worker, expert groups.
    #[serde(default = "one")]
    pub ep: u32,
}

fn one() -> u32 {
    1
}

impl StagePool {
    /// GPUs the pool occupies: `workers · tp · ep`.
    pub fn gpus(&self) -> u32 {
        self.workers * self.gpus_per_worker()
    }

    /// GPUs of one worker: `tp · ep`.
    pub fn gpus_per_worker(&self) -> u32 {
        self.tp * self.ep
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
/// An MoE model's prefill and decode workers may add expert parallelism:
/// `1P(TP2,EP4)` is one prefill worker over 8 GPUs, four attention replicas
/// of TP 2 with the experts split four ways.
///
/// Parsing accepts exactly this grammar, terms in E, P, D order:
/// `term ('+' term)*`, `term = COUNT ('E'|'P'|'D') '(TP' DEGREE [',EP' DEGREE] ')'`,
/// with COUNT ≥ 1 and DEGREE ≥ 1 decimal integers; [`fmt::Display`] prints the
/// same text back (`,EP1` is left out).
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
#[error("invalid allocation `{text}`: {reason}; expected terms like `2E(TP1)+1P(TP2)+1D(TP4)` or, with expert parallelism, `1D(TP2,EP4)` (count, TP and EP degree in 1 ..= 4096, stage E, P or D in that order)")]
pub struct AllocationError {
    /// The text that failed to parse.
    pub text: String,
    /// What was wrong.
    pub reason: String,
}

impl Allocation {
    /// Total GPUs: `Σ workers · tp · ep` over the three stages.
    pub fn gpus(&self) -> u32 {
        self.encode.gpus() + self.prefill.gpus() + self.decode.gpus()
    }

    /// An allocation from worker counts and TP degrees.
    pub fn new(e: (u32, u32), p: (u32, u32), d: (u32, u32)) -> Self {
        let pool = |(workers, tp)| StagePool { workers, tp, ep: 1 };
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
            write!(f, "{}{}(TP{}", pool.workers, letter, pool.tp)?;
            if pool.ep > 1 {
                write!(f, ",EP{}", pool.ep)?;
            }
            f.write_str(")")?;
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
        let zero = StagePool {
            workers: 0,
            tp: 1,
            ep: 1,
        };
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
            let degrees = tail
                .strip_prefix("(TP")
                .and_then(|t| t.strip_suffix(')'))
                .ok_or_else(|| {
                    err(&format!(
                        "`{tail}` is not of the form `(TPk)` or `(TPk,EPe)`"
                    ))
                })?;
            let (tp, ep) = match degrees.split_once(",EP") {
                Some((t, e)) => (
                    parse_uint(t, "TP degree", text)?,
                    parse_uint(e, "EP degree", text)?,
                ),
                None => (parse_uint(degrees, "TP degree", text)?, 1),
            };
            if tp.checked_mul(ep).is_none_or(|g| g > MAX_TERM) {
                return Err(err(&format!("TP × EP must be at most {MAX_TERM}")));
            }
            pools[stage] = StagePool {
                workers: count,
                tp,
                ep,
            };
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
            "2E(TP1)+1P(TP2,EP4)+1D(TP1,EP8)",
        ] {
            let a: Allocation = s.parse().unwrap_or_else(|e| panic!("{s}: {e}"));
            assert_eq!(a.to_string(), s);
        }
        let a: Allocation = "2E(TP1)+1P(TP2)+1D(TP4)".parse().unwrap();
        assert_eq!(a.gpus(), 8);
        assert_eq!(
            a.encode,
            StagePool {
                workers: 2,
                tp: 1,
                ep: 1
            }
        );
        assert_eq!(
            a.prefill,
            StagePool {
                workers: 1,
                tp: 2,
                ep: 1
            }
        );
        assert_eq!(
            a.decode,
            StagePool {
                workers: 1,
                tp: 4,
                ep: 1
            }
        );
        let m: Allocation = "2E(TP1)+1P(TP2,EP4)+1D(TP1,EP8)".parse().unwrap();
        assert_eq!(m.gpus(), 2 + 8 + 8);
        assert_eq!((m.prefill.tp, m.prefill.ep), (2, 4));
        // EP1 is plain TP and prints as such
        let p: Allocation = "1P(TP2,EP1)+1D(TP2)".parse().unwrap();
        assert_eq!(p.to_string(), "1P(TP2)+1D(TP2)");
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
            "1D(TP2,EP0)",
            "1D(TP2,ep4)",
            "1D(TP2,EP)",
            "1D(EP4)",
            "1D(TP2,EP4,EP2)",
            "1D(TP64,EP128)",
        ] {
            let e = s.parse::<Allocation>().expect_err(s);
            assert!(e.to_string().contains("expected terms like"), "{e}");
        }
    }
}
