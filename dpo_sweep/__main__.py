from dpo_sweep.cli import main

raise SystemExit(main())
