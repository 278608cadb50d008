// SPDX-License-Identifier: MIT
// DEVNET STAND-IN. Not for production use.
//
// A plain ERC-20 for the local devnet, written for x402-fleet. The devnet places it at a real
// token's address with anvil_setCode, so no constructor ever runs: storage is set once through
// initialize(), and a single minter can create balances. DevnetToken itself has no EIP-3009 and no
// EIP-2612 permit: it plays the Permit2-only 18-decimal "USDT" of BNB Smart Chain (56/97).
pragma solidity ^0.8.28;

/// @notice Minimal ERC-20 with one-shot initialisation and a minter; base of the devnet tokens.
abstract contract DevnetERC20Base {
    event Transfer(address indexed from, address indexed to, uint256 value);
    event Approval(address indexed owner, address indexed spender, uint256 value);

    bool private _initialized;
    uint8 private _decimals;
    address private _minter;
    string private _name;
    string private _symbol;
    string internal _version;
    uint256 private _totalSupply;
    mapping(address => uint256) private _balances;
    mapping(address => mapping(address => uint256)) private _allowances;

    /// @notice Sets the token metadata and the minter. Callable exactly once (setCode runs no constructor).
    function initialize(
        string calldata name_,
        string calldata symbol_,
        string calldata version_,
        uint8 decimals_,
        address minter_
    ) external {
        require(!_initialized, "DevnetToken: already initialized");
        require(minter_ != address(0), "DevnetToken: minter is the zero address");
        _initialized = true;
        _name = name_;
        _symbol = symbol_;
        _version = version_;
        _decimals = decimals_;
        _minter = minter_;
        _afterInitialize();
    }

    function _afterInitialize() internal virtual {}

    /// @notice Creates `amount` tokens for `to`. Only the minter set at initialisation may call it.
    function mint(address to, uint256 amount) external {
        require(msg.sender == _minter, "DevnetToken: caller is not the minter");
        require(to != address(0), "ERC20: mint to the zero address");
        _totalSupply += amount;
        unchecked {
            _balances[to] += amount; // cannot overflow: bounded by _totalSupply
        }
        emit Transfer(address(0), to, amount);
    }

    function initialized() external view returns (bool) {
        return _initialized;
    }

    function minter() external view returns (address) {
        return _minter;
    }

    function name() public view returns (string memory) {
        return _name;
    }

    function symbol() external view returns (string memory) {
        return _symbol;
    }

    function decimals() external view returns (uint8) {
        return _decimals;
    }

    function totalSupply() external view returns (uint256) {
        return _totalSupply;
    }

    function balanceOf(address account) external view returns (uint256) {
        return _balances[account];
    }

    function allowance(address owner, address spender) external view returns (uint256) {
        return _allowances[owner][spender];
    }

    function approve(address spender, uint256 value) external returns (bool) {
        _approve(msg.sender, spender, value);
        return true;
    }

    function transfer(address to, uint256 value) external returns (bool) {
        _transfer(msg.sender, to, value);
        return true;
    }

    function transferFrom(address from, address to, uint256 value) external returns (bool) {
        uint256 current = _allowances[from][msg.sender];
        if (current != type(uint256).max) {
            require(current >= value, "ERC20: transfer amount exceeds allowance");
            unchecked {
                _allowances[from][msg.sender] = current - value;
            }
        }
        _transfer(from, to, value);
        return true;
    }

    function _approve(address owner, address spender, uint256 value) internal {
        require(owner != address(0), "ERC20: approve from the zero address");
        require(spender != address(0), "ERC20: approve to the zero address");
        _allowances[owner][spender] = value;
        emit Approval(owner, spender, value);
    }

    function _transfer(address from, address to, uint256 value) internal {
        require(from != address(0), "ERC20: transfer from the zero address");
        require(to != address(0), "ERC20: transfer to the zero address");
        uint256 balance = _balances[from];
        require(balance >= value, "ERC20: transfer amount exceeds balance");
        unchecked {
            _balances[from] = balance - value;
            _balances[to] += value; // cannot overflow: bounded by _totalSupply
        }
        emit Transfer(from, to, value);
    }
}

/// @notice The Permit2-only devnet token (no EIP-3009, no EIP-2612).
contract DevnetToken is DevnetERC20Base {}
