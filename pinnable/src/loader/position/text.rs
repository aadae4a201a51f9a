//! A position's text form: what `Display` writes and `FromStr` reads back.

use std::fmt;
use std::str::FromStr;

use super::{PREFIX, Position, VERSION_PLAN, VERSION_PLAN_2, check_version};
use crate::error::{Error, Result};

/// `pinnable-position/1 epoch=3 batch=17 seed=42 shard=0/8 samples=1000 batch_size=12
/// drop_last=false` (`seed=none` for sequential order, `samples=stream` for a stream).
impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{PREFIX}{} epoch={} batch={} seed=",
            self.version(),
            self.epoch,
            self.batch
        )?;
        match self.seed {
            Some(s) => write!(f, "{s}")?,
            None => f.write_str("none")?,
        }
        write!(f, " shard={}/{} samples=", self.rank, self.world)?;
        match self.samples {
            Some(n) => write!(f, "{n}")?,
            None => f.write_str("stream")?,
        }
        write!(
            f,
            " batch_size={} drop_last={}",
            self.batch_size, self.drop_last
        )?;
        if let Some(p) = self.plan {
            write!(f, " plan={p}")?;
        }
        if self.ahead {
            f.write_str(" ahead=true")?;
        }
        Ok(())
    }
}

/// Reads the string form that [`Display`](fmt::Display) writes.
impl FromStr for Position {
    type Err = Error;

    fn from_str(s: &str) -> Result<Position> {
        let bad = |problem: String| Error::Position { problem };
        let mut words = s.split_whitespace();
        let version = words
            .next()
            .and_then(|w| w.strip_prefix(PREFIX))
            .ok_or_else(|| bad(format!("{s:?} does not start with {PREFIX:?}")))?;
        let version: u64 = version
            .parse()
            .map_err(|_| bad(format!("format version {version:?} is not a number")))?;
        check_version(version)?;
        let planned = version == u64::from(VERSION_PLAN) || version == u64::from(VERSION_PLAN_2);
        const KEYS: [&str; 9] = [
            "epoch",
            "batch",
            "seed",
            "shard",
            "samples",
            "batch_size",
            "drop_last",
            "plan",
            "ahead",
        ];
        let mut values: [Option<&str>; 9] = [None; 9];
        for word in words {
            let (key, value) = word
                .split_once('=')
                .ok_or_else(|| bad(format!("{word:?} is not key=value")))?;
            let k = KEYS
                .iter()
                .position(|&k| k == key)
                .ok_or_else(|| bad(format!("unknown key {key:?}")))?;
            if values[k].replace(value).is_some() {
                return Err(bad(format!("{key} is given twice")));
            }
        }
        let get = |k: usize| values[k].ok_or_else(|| bad(format!("{} is missing", KEYS[k])));
        let number = |k: usize, v: &str| {
            v.parse::<u64>()
                .map_err(|_| bad(format!("{}={v:?} is not a number", KEYS[k])))
        };
        let optional = |k: usize, none: &str| -> Result<Option<u64>> {
            let v = get(k)?;
            if v == none {
                Ok(None)
            } else {
                number(k, v).map(Some)
            }
        };
        let (rank, world) = get(3)?
            .split_once('/')
            .ok_or_else(|| bad("shard is not rank/world".into()))?;
        let p = Position {
            epoch: number(0, get(0)?)?,
            batch: number(1, get(1)?)?,
            seed: optional(2, "none")?,
            rank: number(3, rank)?,
            world: number(3, world)?,
            samples: optional(4, "stream")?,
            batch_size: number(5, get(5)?)?,
            drop_last: match get(6)? {
                "true" => true,
                "false" => false,
                v => return Err(bad(format!("drop_last={v:?} is not true or false"))),
            },
            plan: match (planned, values[7]) {
                (true, Some(v)) => Some(number(7, v)?),
                (false, None) => None,
                (true, None) => return Err(bad("plan is missing".into())),
                (false, Some(_)) => {
                    return Err(bad(format!(
                        "plan is not a key of format version {version}"
                    )));
                }
            },
            plan_2: version == u64::from(VERSION_PLAN_2),
            ahead: match values[8] {
                None | Some("false") => false,
                Some("true") => true,
                Some(v) => return Err(bad(format!("ahead={v:?} is not true or false"))),
            },
        };
        p.validate()?;
        Ok(p)
    }
}
