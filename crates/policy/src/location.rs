//! Places on the earth: a connector group's configured location and the
//! user's location an access request may name, the great-circle distance
//! between them, and the round-trip time that distance costs at least.
//!
//! The `nearest` strategy adds that estimated user→group RTT to a
//! candidate's smoothed connector→application RTT (see `select`), so a
//! request goes to the connector whose whole path, user to group to
//! application, is shortest.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Mean radius of the earth in kilometres (IUGG), the sphere `distance_km`
/// measures on (the spherical error, under 0.5 %, is far below what an
/// RTT estimate from distance can tell apart).
pub const EARTH_RADIUS_KM: f64 = 6371.0088;

/// Kilometres of user→group distance that cost one millisecond of round
/// trip: light in optical fibre covers about 200 km per millisecond (the
/// speed of light over a refractive index of about 1.47), and a round trip
/// goes the distance twice. Real routes are longer than great circles, so
/// the estimate is a lower bound; it is meant to rank groups, not to
/// predict a ping.
pub const KM_PER_RTT_MS: f64 = 100.0;

/// A validated point: latitude in [-90, 90] and longitude in [-180, 180]
/// degrees, both finite (which is what makes `Eq` honest here).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Location {
    latitude: f64,
    longitude: f64,
}

impl Eq for Location {}

/// Why a pair of numbers is no location: the field at fault and its value.
#[derive(Clone, Copy, Debug, PartialEq, thiserror::Error)]
pub enum LocationError {
    /// Not a finite number in [-90, 90].
    #[error("latitude {0} is not a number of degrees in -90..=90")]
    Latitude(f64),
    /// Not a finite number in [-180, 180].
    #[error("longitude {0} is not a number of degrees in -180..=180")]
    Longitude(f64),
}

impl LocationError {
    /// The field at fault: `latitude` or `longitude`.
    pub fn field(self) -> &'static str {
        match self {
            LocationError::Latitude(_) => "latitude",
            LocationError::Longitude(_) => "longitude",
        }
    }
}

impl Location {
    /// The point at `latitude`, `longitude` (degrees), or which of the two
    /// is out of range or not finite (latitude first).
    pub fn new(latitude: f64, longitude: f64) -> Result<Location, LocationError> {
        if !(latitude.is_finite() && (-90.0..=90.0).contains(&latitude)) {
            return Err(LocationError::Latitude(latitude));
        }
        if !(longitude.is_finite() && (-180.0..=180.0).contains(&longitude)) {
            return Err(LocationError::Longitude(longitude));
        }
        Ok(Location {
            latitude,
            longitude,
        })
    }

    /// Latitude in degrees (north positive).
    pub fn latitude(self) -> f64 {
        self.latitude
    }

    /// Longitude in degrees (east positive).
    pub fn longitude(self) -> f64 {
        self.longitude
    }

    /// Great-circle distance to `other` in kilometres, by the haversine
    /// formula (well conditioned for small distances, unlike the spherical
    /// law of cosines).
    pub fn distance_km(self, other: Location) -> f64 {
        let (p1, p2) = (self.latitude.to_radians(), other.latitude.to_radians());
        let dp = p2 - p1;
        let dl = (other.longitude - self.longitude).to_radians();
        let h = (dp / 2.0).sin().powi(2) + p1.cos() * p2.cos() * (dl / 2.0).sin().powi(2);
        // Rounding can push h a hair above 1 for antipodes.
        2.0 * EARTH_RADIUS_KM * h.min(1.0).sqrt().asin()
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "({}, {})", self.latitude, self.longitude)
    }
}

/// A location as operators and API callers write it, checked by
/// `Location::try_from`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocationSpec {
    /// Degrees north (negative: south), -90..=90.
    pub latitude: f64,
    /// Degrees east (negative: west), -180..=180.
    pub longitude: f64,
}

impl TryFrom<LocationSpec> for Location {
    type Error = LocationError;
    fn try_from(s: LocationSpec) -> Result<Location, LocationError> {
        Location::new(s.latitude, s.longitude)
    }
}

impl From<Location> for LocationSpec {
    fn from(l: Location) -> Self {
        LocationSpec {
            latitude: l.latitude,
            longitude: l.longitude,
        }
    }
}

/// The least round trip a distance costs: `km / KM_PER_RTT_MS`
/// milliseconds (saturating at about 20,000 km, half the earth, anyway).
pub fn estimated_rtt(km: f64) -> Duration {
    Duration::try_from_secs_f64(km.max(0.0) / KM_PER_RTT_MS / 1000.0).unwrap_or(Duration::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(lat: f64, lon: f64) -> Location {
        Location::new(lat, lon).expect("valid")
    }

    #[test]
    fn distances_are_great_circles() {
        let paris = at(48.8566, 2.3522);
        let london = at(51.5074, -0.1278);
        let new_york = at(40.7128, -74.0060);
        let d = paris.distance_km(london);
        assert!((d - 343.5).abs() < 2.0, "{d}");
        let d = paris.distance_km(new_york);
        assert!((d - 5837.0).abs() < 10.0, "{d}");
        assert_eq!(paris.distance_km(paris), 0.0);
        assert!((paris.distance_km(london) - london.distance_km(paris)).abs() < 1e-9);
        // Across the antimeridian and to the antipode.
        let d = at(0.0, 179.5).distance_km(at(0.0, -179.5));
        assert!((d - 111.2).abs() < 0.5, "{d}");
        let half = std::f64::consts::PI * EARTH_RADIUS_KM;
        assert!((at(0.0, 0.0).distance_km(at(0.0, 180.0)) - half).abs() < 1e-6);
        assert!((at(90.0, 0.0).distance_km(at(-90.0, 0.0)) - half).abs() < 1e-6);
    }

    #[test]
    fn one_millisecond_of_round_trip_per_hundred_kilometres() {
        assert_eq!(estimated_rtt(0.0), Duration::ZERO);
        assert_eq!(estimated_rtt(100.0), Duration::from_millis(1));
        assert_eq!(estimated_rtt(5000.0), Duration::from_millis(50));
        assert_eq!(estimated_rtt(-1.0), Duration::ZERO);
    }

    #[test]
    fn out_of_range_or_not_finite_values_name_their_field() {
        assert!(Location::new(90.0, -180.0).is_ok());
        assert!(Location::new(-90.0, 180.0).is_ok());
        for (lat, lon, field) in [
            (90.5, 0.0, "latitude"),
            (-91.0, 0.0, "latitude"),
            (f64::NAN, 0.0, "latitude"),
            (f64::INFINITY, 0.0, "latitude"),
            (0.0, 180.1, "longitude"),
            (0.0, -200.0, "longitude"),
            (0.0, f64::NEG_INFINITY, "longitude"),
        ] {
            let e = Location::new(lat, lon).expect_err("refused");
            assert_eq!(e.field(), field, "{lat}, {lon}");
            assert!(e.to_string().starts_with(field), "{e}");
        }
        assert_eq!(
            Location::new(91.0, 0.0).expect_err("refused").to_string(),
            "latitude 91 is not a number of degrees in -90..=90"
        );
        let spec = LocationSpec {
            latitude: 48.85,
            longitude: 2.35,
        };
        assert_eq!(Location::try_from(spec).map(LocationSpec::from), Ok(spec));
    }
}
