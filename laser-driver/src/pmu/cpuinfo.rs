//! The CPU identity from `/proc/cpuinfo` text: vendor, family, model. The first processor
//! block is enough (every core of a socket reports the same family and model; hybrid Intel
//! parts differ per core in the PMU, which sysfs describes, not here).

/// Vendor, family and model as the kernel prints them (decimal).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuId {
    /// `vendor_id`: `GenuineIntel`, `AuthenticAMD`, `HygonGenuine`, …
    pub vendor: String,
    /// `cpu family` (e.g. 25 = 0x19, AMD Zen 3 and Zen 4).
    pub family: u32,
    /// `model`.
    pub model: u32,
    /// `model name`, for messages.
    pub model_name: String,
}

impl CpuId {
    /// Parses the first processor block of `/proc/cpuinfo`; `None` when it has no vendor,
    /// family or model (non-x86, or not cpuinfo at all).
    pub fn parse(text: &str) -> Option<CpuId> {
        let (mut vendor, mut family, mut model, mut name) = (None, None, None, String::new());
        for line in text.lines() {
            if line.trim().is_empty() && vendor.is_some() {
                break; // end of the first block
            }
            let Some((k, v)) = line.split_once(':') else {
                continue;
            };
            let v = v.trim();
            match k.trim() {
                "vendor_id" => vendor = Some(v.to_string()),
                "cpu family" => family = v.parse().ok(),
                "model" => model = v.parse().ok(),
                "model name" => name = v.to_string(),
                _ => {}
            }
        }
        Some(CpuId {
            vendor: vendor?,
            family: family?,
            model: model?,
            model_name: name,
        })
    }

    pub fn is_amd(&self) -> bool {
        self.vendor == "AuthenticAMD" || self.vendor == "HygonGenuine"
    }

    /// AMD Zen generation, from family and model ranges (AMD's revision guides; the kernel's
    /// `arch/x86/kernel/cpu/amd.c` uses the same ranges).
    pub fn zen(&self) -> Option<Zen> {
        if !self.is_amd() {
            return None;
        }
        let m = self.model;
        Some(match self.family {
            0x17 if m < 0x30 => Zen::Zen1,
            0x17 => Zen::Zen2,
            // Zen 4: Genoa 10h–1Fh, Raphael 60h–6Fh, Phoenix 70h–7Fh, Bergamo/Siena A0h–AFh;
            // everything else in family 19h (Milan 00h–0Fh, Vermeer 20h–2Fh, Rembrandt
            // 40h–4Fh, Cezanne 50h–5Fh, …) is Zen 3.
            0x19 if matches!(m, 0x10..=0x1f | 0x60..=0x7f | 0xa0..=0xaf) => Zen::Zen4,
            0x19 => Zen::Zen3,
            0x1a => Zen::Zen5,
            f if f < 0x17 => Zen::PreZen,
            _ => Zen::Later,
        })
    }
}

/// AMD core generations that matter for IBS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Zen {
    PreZen,
    Zen1,
    Zen2,
    Zen3,
    Zen4,
    Zen5,
    Later,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpu(vendor: &str, family: u32, model: u32) -> String {
        format!(
            "processor\t: 0\nvendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: {model}\n\
             model name\t: X\n\nprocessor\t: 1\nvendor_id\t: Other\n"
        )
    }

    #[test]
    fn zen_generations_by_family_and_model() {
        let z = |f, m| CpuId::parse(&cpu("AuthenticAMD", f, m)).unwrap().zen();
        assert_eq!(z(0x17, 0x01), Some(Zen::Zen1));
        assert_eq!(z(0x17, 0x31), Some(Zen::Zen2)); // Rome
        assert_eq!(z(0x19, 0x01), Some(Zen::Zen3)); // Milan
        assert_eq!(z(0x19, 0x21), Some(Zen::Zen3)); // Vermeer
        assert_eq!(z(0x19, 0x50), Some(Zen::Zen3)); // Cezanne
        assert_eq!(z(0x19, 0x11), Some(Zen::Zen4)); // Genoa
        assert_eq!(z(0x19, 0x61), Some(Zen::Zen4)); // Raphael
        assert_eq!(z(0x19, 0xa0), Some(Zen::Zen4)); // Bergamo
        assert_eq!(z(0x1a, 0x02), Some(Zen::Zen5));
        let intel = CpuId::parse(&cpu("GenuineIntel", 6, 85)).unwrap();
        assert_eq!((intel.family, intel.model, intel.zen()), (6, 85, None));
        // Only the first block counts.
        assert_eq!(intel.vendor, "GenuineIntel");
        assert_eq!(CpuId::parse("processor : 0\n"), None);
    }
}
