//! Figures from repeats. A ratio against another system is taken from repeats interleaved in
//! one process (ours, theirs, ours, theirs …), one ratio a repeat, and reported as their
//! median with its range: both sides then see the same machine at the same time, and the
//! spread between repeats shows.

use std::fmt;

/// A figure measured in several repeats: the median with its range.
///
/// ```
/// use pinnable_harness::bench::Spread;
///
/// let r = Spread::ratios(vec![4.4, 3.9, 4.2, 4.0, 4.1]);
/// assert_eq!((r.median(), r.min(), r.max()), (4.1, 3.9, 4.4));
/// assert_eq!(r.to_string(), "4.10× (3.90–4.40×, 5 repeats)");
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Spread {
    sorted: Vec<f64>,
    unit: Unit,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Unit {
    Ratio,
    Millis,
}

impl Spread {
    /// Ratios, one a repeat (shown as `4.10×`).
    ///
    /// # Panics
    ///
    /// If `values` is empty.
    pub fn ratios(values: Vec<f64>) -> Spread {
        Spread::new(values, Unit::Ratio)
    }

    /// Times in seconds, one a repeat (shown in ms).
    ///
    /// # Panics
    ///
    /// If `seconds` is empty.
    pub fn seconds(seconds: Vec<f64>) -> Spread {
        Spread::new(seconds, Unit::Millis)
    }

    fn new(mut sorted: Vec<f64>, unit: Unit) -> Spread {
        assert!(!sorted.is_empty(), "a spread of no repeats");
        sorted.sort_by(f64::total_cmp);
        Spread { sorted, unit }
    }

    /// The median (the upper one for an even count).
    pub fn median(&self) -> f64 {
        self.sorted[self.sorted.len() / 2]
    }

    /// The smallest value.
    pub fn min(&self) -> f64 {
        self.sorted[0]
    }

    /// The largest value.
    pub fn max(&self) -> f64 {
        self.sorted[self.sorted.len() - 1]
    }

    /// The repeats.
    pub fn len(&self) -> usize {
        self.sorted.len()
    }

    /// Always false: a spread has at least one repeat.
    pub fn is_empty(&self) -> bool {
        self.sorted.is_empty()
    }
}

impl fmt::Display for Spread {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (scale, unit, digits) = match self.unit {
            Unit::Ratio => (1.0, "×", 2),
            Unit::Millis => (1e3, " ms", 3),
        };
        let repeats = match self.len() {
            1 => "1 repeat".to_owned(),
            n => format!("{n} repeats"),
        };
        write!(
            f,
            "{:.digits$}{unit} ({:.digits$}–{:.digits$}{unit}, {repeats})",
            self.median() * scale,
            self.min() * scale,
            self.max() * scale,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_show_in_milliseconds_with_their_range() {
        let t = Spread::seconds(vec![0.000_731, 0.000_705, 0.000_712]);
        assert_eq!(t.to_string(), "0.712 ms (0.705–0.731 ms, 3 repeats)");
        assert_eq!(
            Spread::ratios(vec![2.0]).to_string(),
            "2.00× (2.00–2.00×, 1 repeat)"
        );
    }

    #[test]
    fn an_even_count_takes_the_upper_median() {
        assert_eq!(Spread::ratios(vec![4.0, 1.0, 3.0, 2.0]).median(), 3.0);
    }
}
