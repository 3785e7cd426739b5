//! A builder for test segments, rendered either as a `[[segments]]` table
//! of the CA's config file or as the wire `Segment` a CA assigns, so a test
//! names each field instead of passing eight positional arguments.

use protocol::v1;

/// A segment under construction. Unset lists are empty; the health mode is
/// `continuous` and the report interval 1000 ms unless set.
#[derive(Clone, Debug)]
pub struct Segment {
    name: String,
    applications: Vec<String>,
    tcp_ports: Vec<String>,
    udp_ports: Vec<String>,
    mode: String,
    interval_ms: u64,
    groups: Vec<String>,
    extra: String,
}

fn strings<T: ToString>(items: impl IntoIterator<Item = T>) -> Vec<String> {
    items.into_iter().map(|i| i.to_string()).collect()
}

impl Segment {
    /// A segment called `name`.
    pub fn new(name: &str) -> Segment {
        Segment {
            name: name.to_owned(),
            applications: Vec::new(),
            tcp_ports: Vec::new(),
            udp_ports: Vec::new(),
            mode: "continuous".to_owned(),
            interval_ms: 1000,
            groups: Vec::new(),
            extra: String::new(),
        }
    }

    /// Its applications (host names, wildcards, addresses, CIDR blocks).
    pub fn apps<T: ToString>(mut self, apps: impl IntoIterator<Item = T>) -> Segment {
        self.applications = strings(apps);
        self
    }

    /// Its TCP ports: numbers or `"lo-hi"` ranges.
    pub fn tcp<T: ToString>(mut self, ports: impl IntoIterator<Item = T>) -> Segment {
        self.tcp_ports = strings(ports);
        self
    }

    /// Its UDP ports: numbers or `"lo-hi"` ranges.
    pub fn udp<T: ToString>(mut self, ports: impl IntoIterator<Item = T>) -> Segment {
        self.udp_ports = strings(ports);
        self
    }

    /// Its health reporting mode as the config spells it: `continuous`,
    /// `on_access` or `none`.
    pub fn mode(mut self, mode: &str) -> Segment {
        self.mode = mode.to_owned();
        self
    }

    /// Its report interval.
    pub fn interval_ms(mut self, ms: u64) -> Segment {
        self.interval_ms = ms;
        self
    }

    /// The connector groups that serve it.
    pub fn groups<T: ToString>(mut self, groups: impl IntoIterator<Item = T>) -> Segment {
        self.groups = strings(groups);
        self
    }

    /// Config lines appended to its table as they are (e.g.
    /// `multimatch = true`).
    pub fn extra(mut self, lines: &str) -> Segment {
        self.extra = lines.to_owned();
        self
    }

    /// The `[[segments]]` table of a CA config file.
    pub fn toml(&self) -> String {
        let list = |v: &[String]| {
            v.iter()
                .map(|s| format!("{s:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        format!(
            r#"
[[segments]]
name = "{name}"
applications = [{apps}]
tcp_ports = [{tcp}]
udp_ports = [{udp}]
health_reporting = "{mode}"
report_interval_ms = {interval_ms}
connector_groups = [{groups}]
{extra}
"#,
            name = self.name,
            apps = list(&self.applications),
            tcp = list(&self.tcp_ports),
            udp = list(&self.udp_ports),
            mode = self.mode,
            interval_ms = self.interval_ms,
            groups = list(&self.groups),
            extra = self.extra,
        )
    }

    /// The wire segment a CA assigns. Panics on a port or mode the config
    /// would reject (a test's own mistake); `extra` has no wire form and is
    /// left out.
    pub fn proto(&self) -> v1::Segment {
        let mode = match self.mode.as_str() {
            "continuous" => v1::HealthReporting::Continuous,
            "on_access" => v1::HealthReporting::OnAccess,
            "none" => v1::HealthReporting::None,
            other => panic!("no health reporting mode {other:?}"),
        };
        let interval_ms = u32::try_from(self.interval_ms).expect("interval fits u32");
        v1::Segment {
            name: self.name.clone(),
            applications: self.applications.clone(),
            tcp_ports: self.tcp_ports.iter().map(|p| range(p)).collect(),
            udp_ports: self.udp_ports.iter().map(|p| range(p)).collect(),
            health_reporting: mode as i32,
            report_interval_s: interval_ms.div_ceil(1000).max(1),
            report_interval_ms: interval_ms,
            connector_groups: self.groups.clone(),
            ..Default::default()
        }
    }
}

/// `"80"` or `"8000-8100"` as a wire port range.
fn range(ports: &str) -> v1::PortRange {
    let port = |p: &str| p.trim().parse::<u32>().expect("a port number");
    match ports.split_once('-') {
        Some((lo, hi)) => v1::PortRange {
            start: port(lo),
            end: port(hi),
        },
        None => v1::PortRange {
            start: port(ports),
            end: port(ports),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_the_config_table_the_scenarios_wrote_by_hand() {
        let toml = Segment::new("lab")
            .apps(["*.lab.test", "10.0.0.0/8"])
            .tcp(["80", "8000-8100"])
            .mode("on_access")
            .interval_ms(500)
            .groups(["g"])
            .extra("multimatch = true")
            .toml();
        assert_eq!(
            toml,
            r#"
[[segments]]
name = "lab"
applications = ["*.lab.test", "10.0.0.0/8"]
tcp_ports = ["80", "8000-8100"]
udp_ports = []
health_reporting = "on_access"
report_interval_ms = 500
connector_groups = ["g"]
multimatch = true
"#
        );
    }

    #[test]
    fn the_wire_form_carries_ranges_mode_and_interval() {
        let s = Segment::new("app")
            .apps(["app.test"])
            .tcp([80_u16])
            .udp(["5000-5010"])
            .mode("none")
            .interval_ms(1500)
            .groups(["dc-east"])
            .proto();
        assert_eq!(s.tcp_ports, vec![v1::PortRange { start: 80, end: 80 }]);
        assert_eq!(
            s.udp_ports,
            vec![v1::PortRange {
                start: 5000,
                end: 5010
            }]
        );
        assert_eq!(s.health_reporting, v1::HealthReporting::None as i32);
        assert_eq!((s.report_interval_s, s.report_interval_ms), (2, 1500));
        assert_eq!(s.connector_groups, vec!["dc-east".to_owned()]);
    }
}
